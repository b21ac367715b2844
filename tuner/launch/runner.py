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

from tuner.disk_messages import os_error_message
from tuner.fileio import open_log
from tuner.rundir.events import Event, EventFollower
from tuner.rundir.layout import EVENTS_FILE, LOG_FILE
from tuner.rundir.lock import supervisor_environment


def executable_argv(argv: list[str]) -> list[str]:
    """Run ``accelerate`` from the same environment as tuner itself, even when it is not on PATH.  ``accelerate
    launch`` runs as its own module (``accelerate.commands.launch``, the same parser and launcher): the ``accelerate``
    command imports every subcommand first (``estimate`` imports transformers' model code), 2.5-4 s of each launch."""
    if argv[:2] == ["accelerate", "launch"]:
        return [sys.executable, "-m", "accelerate.commands.launch", *argv[2:]]
    if argv and argv[0] == "accelerate":
        beside = Path(sys.executable).with_name("accelerate")
        if beside.exists():
            return [str(beside), *argv[1:]]
        if shutil.which("accelerate") is None:
            return [sys.executable, "-m", "accelerate.commands.accelerate_cli", *argv[1:]]
    return list(argv)


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment: tuner's own.  They run tuner's interpreter (``executable_argv``), so they import the
    tuner installed there, as this process did; no source folder is put on their path."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
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
        self._new: deque[str] = deque(maxlen=2000)  # lines not yet taken by new_lines()
        self.log_problem: str | None = None  # why the log stopped being written, if it did
        self._log = open_log(self.log_path)
        self.process = subprocess.Popen(
            executable_argv(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # the ranks stop by themselves if this process dies (tuner.train.supervision)
            env=child_environment({**supervisor_environment(), **(env or {})}),
            start_new_session=True,  # its own process group: stop() reaches every rank
            text=True,
            errors="replace",
        )
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        """Log every line of the ranks' output.  A log that can no longer be written (the disk full) is given up,
        said once in :attr:`log_problem`, while the output is still read: a rank blocked on a full pipe would hang."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if self.log_problem is None:
                try:
                    self._log.write(line)
                    self._log.flush()
                except OSError as exc:
                    self.log_problem = self._log_failed(exc)
            self.tail.append(line.rstrip("\n"))
            self._new.append(line.rstrip("\n"))
        try:
            self._log.close()
        except OSError as exc:  # the last buffered bytes did not fit either
            self.log_problem = self.log_problem or self._log_failed(exc)

    def _log_failed(self, exc: OSError) -> str:
        exc.filename = exc.filename or str(self.log_path)
        return f"the run's log stopped: {os_error_message(exc)}"

    def poll_events(self) -> list[Event]:
        return self.events.poll()

    def new_lines(self) -> list[str]:
        """Log lines printed since the last call."""
        lines = []
        while self._new:
            lines.append(self._new.popleft())
        return lines

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit code once the process group's leader exits (at once, not at the next poll); None after
        ``timeout_s`` while it still runs."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def finish(self) -> int:
        """After the leader's exit: nothing of its group may outlive it, and the rest of the output is in the log."""
        code = self.process.wait()
        self._kill_leftovers()
        self._reader.join(timeout=10)
        return code

    def stop(self, grace_s: float = 20.0) -> int:
        """SIGINT the whole group (ranks save and exit), then SIGTERM, then SIGKILL."""
        stop_process_groups([self.process], grace_s)
        return self.finish()

    def _kill_leftovers(self) -> None:
        """Ranks can outlive the launcher that started them: nothing of the group may survive a stop."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def stop_process_groups(processes: list[subprocess.Popen], grace_s: float = 20.0) -> None:
    """SIGINT the process group each of ``processes`` leads (started with ``start_new_session``), then SIGTERM,
    then SIGKILL, each signal after the last one's wait for every leader to exit."""
    for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        running = [process for process in processes if process.poll() is None]
        if not running:
            return
        for process in running:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        for process in running:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                break


def log_tail(path: Path, size: int = 256 * 1024) -> list[str]:
    """The end of a log, enough for torchrun's failure summary and the lines before it."""
    with open(path, "rb") as stream:
        stream.seek(max(0, path.stat().st_size - size))
        return stream.read().decode("utf-8", errors="replace").splitlines()
