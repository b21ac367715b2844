"""Libraries' own output into the run's log, not the user's terminal.

Loading a model and scoring it in tuner's process makes the libraries speak: transformers' loading bars, lm-eval's
request bars, bitsandbytes' notice about an optional kernel package, a ``git describe`` lm-eval runs whose error
git prints itself, datasets' "Generating train split" bar while a run's data is read for its prompt format. None of
it is tuner's to show; it goes to the end of the run's log (``train.log``, where the ranks' output goes too), or for a
model that is no run's to ``$TUNER_HOME/logs/libraries.log``, unless the user asks to see it (``--verbose``).  Each
command wraps the library work it does in its own process (loading, scoring, reading data), never its own lines.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from tuner.fileio import open_log
from tuner.home import tuner_home
from tuner.rundir.layout import LOG_FILE

LIBRARY_LOG = Path("logs") / "libraries.log"  # under $TUNER_HOME: the libraries' output of a command without a run
LIBRARY_LOG_BYTES = 16 * 2**20  # past this the log is moved to libraries.log.1 (one older log kept): bounded
VERBOSE_HELP = ("show the libraries' own output (loading and scoring bars, notices) here, not only in the run's "
                f"train.log (or $TUNER_HOME/{LIBRARY_LOG} for a model that is no run's)")


def library_log(run_dir: Path | None) -> Path:
    """Where the libraries' output of a command goes: its run's ``train.log``, or tuner's own bounded log."""
    if run_dir is not None:
        return Path(run_dir) / LOG_FILE
    log = tuner_home() / LIBRARY_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        if log.stat().st_size > LIBRARY_LOG_BYTES:
            os.replace(log, log.with_name(log.name + ".1"))
    except FileNotFoundError:
        pass
    return log


def libraries_to_log(run_dir: Path | None, shown: bool = False):
    """:func:`output_to_log` into :func:`library_log`; ``shown`` (``--verbose``) keeps the terminal."""
    return contextlib.nullcontext() if shown else output_to_log(library_log(run_dir))


@contextlib.contextmanager
def output_to_log(log: Path, shown: bool = False):
    """Within the block, everything written to stdout and stderr -- by Python (``sys.stdout``, logging, tqdm) and
    below it (file descriptors 1 and 2, which a subprocess inherits) -- is appended to ``log``; ``shown`` keeps the
    terminal. An exception leaves the block after the terminal is back, so its message reaches the user."""
    if shown:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    with open_log(log, errors="replace") as sink:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
        finally:
            sink.flush()
            for descriptor, copy in zip((1, 2), saved):
                os.dup2(copy, descriptor)
                os.close(copy)
