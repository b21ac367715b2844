"""Under the wizard, nothing a library prints reaches the terminal: it goes to ``$TUNER_HOME/tui.log``.

Textual redirects ``sys.stdout`` and ``sys.stderr`` while the app runs, but much output bypasses them: a logging
handler or a tqdm bar that took ``sys.stderr`` before the app started, C extensions writing to file descriptor 2, and
child processes (the demo model is built in one), which inherit descriptors 1 and 2 and print "Writing model shards:
100%" straight over the screen.  So the capture is done on the descriptors: 1 and 2 become a pipe drained into the
log by a thread, and Textual draws on duplicates of the terminal (``sys.__stdout__``/``sys.__stderr__``, which its
driver writes to and measures the terminal by).  The log is rewritten at each start of the wizard.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Iterator

from tuner.fileio import open_log

LOG_NAME = "tui.log"


def log_path() -> Path:
    from tuner.home import tuner_home

    return tuner_home() / LOG_NAME


def _drain(read_end: int, log) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            log.write(chunk)
            log.flush()


@contextlib.contextmanager
def library_output_to(path: Path) -> Iterator[None]:
    """Descriptors 1 and 2 into ``path`` while the block runs; ``sys.__stdout__``/``sys.__stderr__`` stay the
    terminal.  Restored on the way out, whatever happens."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open_log(path, fresh=True, binary=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    dunders = sys.__stdout__, sys.__stderr__
    terminal = [open(os.dup(fd), "w", encoding=getattr(stream, "encoding", None) or "utf-8", errors="replace",
                     closefd=True) for fd, stream in ((1, sys.__stdout__), (2, sys.__stderr__))]
    read_end, write_end = os.pipe()
    drain = threading.Thread(target=_drain, args=(read_end, log), name="library-output", daemon=True)
    drain.start()
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    sys.__stdout__, sys.__stderr__ = terminal
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.__stdout__, sys.__stderr__ = dunders
        for fd, copy in saved.items():
            os.dup2(copy, fd)  # the pipe's last write end closes (a child still holding it keeps it open)
            os.close(copy)
        for stream in terminal:
            stream.close()
        drain.join(timeout=2.0)
        if not drain.is_alive():
            log.close()
