"""The Data step's example, made in a child process: the wizard's event loop never waits for it.

The example is :func:`tuner.data.preview.preview_examples`, what ``tuner data preview`` prints, on the model's
tokenizer.  Made in a thread of the wizard, the imports it needs (torch, transformers, datasets: seconds) took the
GIL from the UI thread in slices, and the event loop stalled up to 1.7 s; a child process has its own interpreter.
The child is bounded: it is killed (with what it started, such as the built-in model's build) when its answer is
no longer wanted (a newer question, the step left, the wizard closed) or after ``TUNER_PREVIEW_TIMEOUT`` seconds
(default :data:`DEFAULT_TIMEOUT`).  Between questions it stays, its libraries loaded.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuner.tui.output import LOG_NAME

log = logging.getLogger("tuner")

TIMEOUT_VARIABLE = "TUNER_PREVIEW_TIMEOUT"
DEFAULT_TIMEOUT = 300.0  # seconds: the built-in model's first build (a minute or less) and a first read of the data
_POLL_S = 0.1  # how often the waiting thread looks for an answer, a cancellation, the time limit


@dataclass
class Preview:
    """One formatted sample (segments of text and whether they earn loss), or why there is none; ``pid``: the
    process that made it."""

    data_format: str = ""
    segments: list | None = None
    error: str | None = None
    pid: int = 0


def preview_timeout() -> float:
    """``TUNER_PREVIEW_TIMEOUT`` seconds, or :data:`DEFAULT_TIMEOUT` (also for a value that is not a positive number)."""
    configured = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    try:
        seconds = float(configured) if configured else DEFAULT_TIMEOUT
    except ValueError:
        seconds = 0.0
    if seconds > 0:
        return seconds
    log.warning("%s=%r is not a positive number of seconds; using %d s", TIMEOUT_VARIABLE, configured, DEFAULT_TIMEOUT)
    return DEFAULT_TIMEOUT


def first_example(recipe, say: Callable[[str], None]) -> Preview:
    """The first training example exactly as the trainer tokenises and masks it (``say``: a note while it takes
    long, such as the built-in model's first build)."""
    from tuner.catalog.demo import is_builtin
    from tuner.data.preview import preview_examples
    from tuner.doctor import check_model
    from tuner.loading.demo_model import is_current
    from tuner.loading.model import load_tokenizer

    model = check_model(recipe)
    if model.status != "ok":  # never a download (or minutes of retries offline) behind "loading an example"
        return Preview(error=f"the preview reads the model's tokenizer from this machine: {model.detail} ({model.fix})")
    if is_builtin(recipe.model.id) and not is_current(recipe.model.id):  # once, a minute or less
        say(f"building the built-in model {recipe.model.id} (once; its output goes to {LOG_NAME} under TUNER_HOME)…")
    try:
        data_format, examples = preview_examples(recipe, load_tokenizer(recipe), count=1)
    except Exception as exc:  # any data or tokenizer problem is shown in place of the example
        return Preview(error=str(exc) or type(exc).__name__)
    if not examples:
        return Preview(error="the training split is empty")
    return Preview(data_format, examples[0].segments)


def serve(conn) -> None:
    """The child: answer each recipe sent with ("note", text)... then ("done", Preview), until the pipe closes."""
    while True:
        try:
            recipe = conn.recv()
        except (EOFError, OSError):
            return
        answer = first_example(recipe, lambda note: conn.send(("note", note)))
        answer.pid = os.getpid()
        conn.send(("done", answer))


def _same_tuner() -> dict[str, str]:
    """The environment with this tuner's folder first on PYTHONPATH: the child runs the code the wizard runs (a
    relative PYTHONPATH entry, or another tuner installed, would give it another, whose answers may not unpickle)."""
    import tuner

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tuner.__file__).resolve().parents[1]),
                                         *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    return env


class PreviewProcess:
    """The child process that makes previews, started on the first question; :meth:`ask` from one thread at a time
    (others wait their turn), :meth:`stop` from any."""

    def __init__(self) -> None:
        self._process = None
        self._conn = None
        self._turn = threading.Lock()  # one question at a time
        self._state = threading.Lock()  # the process and its pipe

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def ask(self, recipe, say: Callable[[str], None], cancelled: Callable[[], bool]) -> Preview | None:
        """The child's preview of ``recipe``; None once ``cancelled()`` (the child is killed: its work is unwanted).
        A child past the time limit is killed and the answer says so."""
        with self._turn:
            if cancelled():
                return None
            conn = self._start()
            limit = preview_timeout()
            deadline = time.monotonic() + limit
            try:
                conn.send(recipe)
                while True:
                    if cancelled():
                        self.stop()
                        return None
                    if time.monotonic() > deadline:
                        self.stop()
                        return Preview(error=f"no example after {limit:.0f} s, so its process was stopped (the "
                                             f"limit is {TIMEOUT_VARIABLE}, in seconds); `tuner data preview "
                                             "RECIPE` shows it outside the wizard")
                    if conn.poll(_POLL_S):
                        kind, payload = conn.recv()
                        if kind == "done":
                            return payload
                        say(payload)
            except (EOFError, OSError):  # it died (killed by stop(), or out of memory): said once, and a new one next
                code = self._exit_code()
                self.stop()
                if cancelled():
                    return None
                return Preview(error=f"the preview's process ended (exit code {code}); what it printed is in "
                                     f"{LOG_NAME} under TUNER_HOME")

    def _exit_code(self) -> int | None:
        """The child's exit code once it has exited (its end of the pipe closes a moment before), None if it lives."""
        process = self._process
        if process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=1)
        return process.returncode

    def _start(self):
        with self._state:
            if self._process is not None and self._process.poll() is not None:  # died between questions
                self._conn.close()
                self._process = self._conn = None
            if self._process is None:
                from multiprocessing.connection import Connection

                ours, theirs = socket.socketpair()
                # a session of its own (killed with whatever it starts, such as the built-in model's build); its
                # output goes where the wizard's libraries' goes (tuner.tui.output)
                self._process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                                 stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()],
                                                 start_new_session=True, env=_same_tuner())
                theirs.close()
                self._conn = Connection(ours.detach())
            return self._conn

    def stop(self) -> None:
        """Kill the child and what it started, now (its libraries are reloaded by the next one)."""
        with self._state:
            process, conn, self._process, self._conn = self._process, self._conn, None, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # its session's group: pgid = its pid
        process.wait()
        conn.close()


if __name__ == "__main__":  # the child PreviewProcess starts; answers are this module's classes, imported by name
    from multiprocessing.connection import Connection

    from tuner.tui import preview

    preview.serve(Connection(int(sys.argv[1])))
