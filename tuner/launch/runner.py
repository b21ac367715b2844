"""Run a launch command as a child process group: log its output, follow its events, stop it cleanly.

The CLI and the TUI both use :class:`Launch`; neither parses Trainer output: progress
comes from the run directory's JSON-lines event stream.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

from tuner.events import EventFollower
from tuner.run_layout import EVENTS_FILE, LOG_FILE


def executable_argv(argv: list[str]) -> list[str]:
    """Run ``accelerate`` from the same environment as tuner itself, even when it is not on PATH."""
    if argv and argv[0] == "accelerate":
        beside = Path(sys.executable).with_name("accelerate")
        if beside.exists():
            return [str(beside), *argv[1:]]
        if shutil.which("accelerate") is None:
            return [sys.executable, "-m", "accelerate.commands.accelerate_cli", *argv[1:]]
    return list(argv)


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the package must be importable by every rank, wherever the launch was started
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


class Launch:
    """One launched run: a process group whose output goes to ``<run>/train.log``."""

    def __init__(self, argv: list[str], run_dir: Path, env: dict[str, str] | None = None):
        self.run_dir = Path(run_dir)
        self.log_path = self.run_dir / LOG_FILE
        self.events = EventFollower(self.run_dir / EVENTS_FILE)
        self.events.skip_existing()
        self.tail: deque[str] = deque(maxlen=40)
        self._log = open(self.log_path, "a", encoding="utf-8")
        self.process = subprocess.Popen(
            executable_argv(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_environment(env),
            start_new_session=True,  # its own process group: stop() reaches every rank
            text=True,
            errors="replace",
        )
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._log.write(line)
            self._log.flush()
            self.tail.append(line.rstrip("\n"))
        self._log.close()

    def poll_events(self) -> list[dict]:
        return self.events.poll()

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace_s: float = 20.0) -> int:
        """SIGINT the whole group (ranks save and exit), then SIGTERM, then SIGKILL."""
        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if self.process.poll() is not None:
                break
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        return self.wait()

    def wait(self, on_events: Callable[[list[dict]], None] | None = None, interval_s: float = 0.5) -> int:
        while self.process.poll() is None:
            if on_events:
                new = self.poll_events()
                if new:
                    on_events(new)
            time.sleep(interval_s)
        self._reader.join(timeout=10)
        if on_events:
            new = self.poll_events()
            if new:
                on_events(new)
        return self.process.returncode
