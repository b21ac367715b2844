"""One tuner at a time per run directory: a lock file beside it, held by the process that writes or launches it.

Two ``tuner run --resume`` into the same folder would both rewrite its lock recipe and train into it; the second
is refused instead, naming the first.  The lock sits next to the run directory (``runs/.NAME.tuner-lock``), so it
can be taken before the directory exists and is never one of the run's own files.  It records the holder's PID, host
and process start time: a lock whose process is gone (or whose PID now belongs to another process) is stale and
taken over; a lock held on another host cannot be checked from here and is reported with the way to clear it.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from tuner.fileio import FILE, create_exclusive_text, entry_kind, read_limited
from tuner.rundir.layout import RUN_LOCK


class RunLocked(Exception):
    """Another process holds the run directory; ``str()`` says which and what to do."""


MAX_LOCK_BYTES = 4096  # a lock tuner writes is one short JSON line
# Set by `tuner run` for the processes it launches: the holder (pid, host, start time) the ranks stop without
# (tuner.train.supervision).  Launchers between them (accelerate launch, torchrun, which starts each rank in a
# session of its own) pass the environment on; a parent-death signal would reach only the first of them.
SUPERVISOR_VARIABLE = "TUNER_SUPERVISOR"


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    started: float | None  # the holder process's start time (psutil), to tell a reused PID apart

    def alive(self) -> bool | None:
        """True or False on this host; None when the holder is on another host (cannot be checked)."""
        if self.host != socket.gethostname():
            return None
        import psutil

        try:
            process = psutil.Process(self.pid)
            return self.started is None or abs(process.create_time() - self.started) < 1.0
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, OverflowError):  # no such pid, or none at all
            return False


def this_process() -> Holder:
    return Holder(os.getpid(), socket.gethostname(), _process_start_time(os.getpid()))


def supervisor_environment() -> dict[str, str]:
    """The environment variable that names this process as the supervisor of what it launches."""
    me = this_process()
    return {SUPERVISOR_VARIABLE: json.dumps({"pid": me.pid, "host": me.host, "started": me.started})}


def supervisor() -> Holder | None:
    """The process that launched this one and must outlive it (None: launched by hand, e.g. launch.sh)."""
    try:
        data = json.loads(os.environ[SUPERVISOR_VARIABLE])
        return Holder(int(data["pid"]), str(data["host"]), data.get("started"))
    except (KeyError, ValueError, TypeError):
        return None


def _process_start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def lock_path(run_dir: str | os.PathLike) -> Path:
    run_dir = Path(run_dir).absolute()
    return run_dir.parent / f".{run_dir.name}{RUN_LOCK}"


class RunLock:
    """``with RunLock(run_dir): ...`` holds the run directory; :meth:`acquire` raises :class:`RunLocked` when taken."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = lock_path(run_dir)
        self.held = False
        self.nested = False  # this process held it already (prepare, then render into it): the outer holder releases

    def holder(self) -> Holder | None:
        """Who holds the lock (None: nobody); a damaged lock file is a holder that is gone (pid -1).  A name that is
        not a plain file (a pipe would never answer a read, a link leads elsewhere) is not tuner's to read or
        remove: :class:`RunLocked` says so."""
        try:
            kind = entry_kind(self.path)
            if kind != FILE:
                raise RunLocked(f"{self.path}: not a lock file tuner wrote ({kind}); tuner keeps its run lock there. "
                                "Move it away, or choose another output.dir.")
            data = json.loads(read_limited(self.path, MAX_LOCK_BYTES, pipes=False))
            started = data.get("started")
            finite = isinstance(started, (int, float)) and not isinstance(started, bool) and abs(started) < 1e12
            return Holder(int(data["pid"]), str(data["host"]), float(started) if finite else None)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError):
            return Holder(-1, "", None)  # not a lock tuner wrote: treated as stale

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        holder = this_process()
        me = {"pid": holder.pid, "host": holder.host, "started": holder.started}
        for _ in range(3):
            try:
                create_exclusive_text(self.path, json.dumps(me))
            except FileExistsError:
                holder = self.holder()
                if holder is None:
                    continue  # released meanwhile
                if holder.pid == os.getpid() and holder.host == me["host"]:
                    self.held = self.nested = True  # this process already holds it (e.g. render, then launch)
                    return self
                alive = holder.alive() if holder.pid > 0 else False
                if alive is False:
                    self.path.unlink(missing_ok=True)  # stale: its process is gone
                    continue
                where = f"pid {holder.pid}" + (f" on {holder.host}" if alive is None else "")
                raise RunLocked(
                    f"{self.run_dir}: another tuner ({where}) is using this run directory; wait for it to finish, "
                    f"stop it, or choose another output.dir"
                    + (f" (if that process is gone, remove {self.path})" if alive is None else "") + ".") from None
            self.held = True
            return self
        raise RunLocked(f"{self.run_dir}: could not take the lock {self.path}; try again.")

    def release(self) -> None:
        if self.held and not self.nested:
            try:
                holder = self.holder()
            except RunLocked:
                holder = None  # replaced by something else meanwhile: not ours to remove
            if holder is not None and holder.pid == os.getpid():
                self.path.unlink(missing_ok=True)
        self.held = self.nested = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
