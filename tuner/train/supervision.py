"""A rank never trains on after the ``tuner run`` that launched it has died (a SIGKILL, a lost terminal, the OOM
killer): nobody would follow it, stop it, or know which checkpoint it left.

``tuner run`` names itself in the environment of what it launches (:data:`tuner.rundir.lock.SUPERVISOR_VARIABLE`);
between them sit ``accelerate launch`` and torchrun, which starts every rank in a session of its own, so a
parent-death signal set by tuner would reach only the launcher and a process-group kill would miss the ranks.
Each rank therefore watches the supervisor itself: a thread checks once a second that the process (its PID and
start time) still runs, and when it is gone kills the rank's process group (the rank and its data workers) without
saving.  A checkpoint is marked complete only while the supervisor lives (:func:`supervisor_alive`), so one the
Trainer writes after the supervisor's death is never resumed from.  A run started by hand (``launch.sh``) has no
supervisor and is not watched.
"""
from __future__ import annotations

import logging
import os
import signal
import threading

from tuner.rundir.lock import supervisor

log = logging.getLogger("tuner")

WATCH_INTERVAL_S = 1.0


def supervisor_alive() -> bool:
    """False once the supervising ``tuner run`` is known to be gone; True without one, or on another host."""
    holder = supervisor()
    return holder is None or holder.alive() is not False


def _stop_without_saving() -> None:
    log.error("the tuner run that launched this rank (pid %s) is gone: stopping without saving", supervisor().pid)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def watch_supervisor(interval_s: float = WATCH_INTERVAL_S) -> threading.Thread | None:
    """Start the daemon thread that stops this rank when its supervisor dies (None: nothing to watch)."""
    if supervisor() is None:
        return None

    def watch() -> None:
        stopped = threading.Event()
        while not stopped.wait(interval_s):
            if not supervisor_alive():
                _stop_without_saving()

    thread = threading.Thread(target=watch, name="tuner-supervisor-watch", daemon=True)
    thread.start()
    return thread
