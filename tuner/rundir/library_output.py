"""Libraries' own output into the run's log, not the user's terminal.

Loading a model and scoring it in tuner's process makes the libraries speak: transformers' loading bars, lm-eval's
request bars, bitsandbytes' notice about an optional kernel package, a ``git describe`` lm-eval runs whose error
git prints itself. None of it is tuner's to show; it goes to the end of the run's log (``train.log``, where the
ranks' output goes too), unless the user asks to see it (``--verbose``).
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


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
    with open(log, "a", encoding="utf-8", errors="replace") as sink:
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
