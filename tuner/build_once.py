"""Build a cache once, read it only when complete: across processes, ranks and machines that share a filesystem.

Every cache tuner keeps under ``$TUNER_HOME`` goes through :func:`build_once`.  The ranks of a run, or machines whose
home is one shared (NFS) filesystem, ask for the same cache at the same moment; one builds it, the others wait, and
none of them ever reads a half-built one:

- The builder holds a lock beside the cache (``.NAME.lock``): filelock's :class:`~filelock.SoftFileLease`, a marker
  file created exclusively that names the builder's host and pid, with a heartbeat thread refreshing it while the
  build runs.  Not flock/fcntl, which NFS mounted without a lock daemon and some parallel filesystems ignore.
- It builds into a hidden sibling folder, writes the completion marker (:data:`BUILT_MARKER`) last and renames the
  folder into place; a crash at any moment leaves no folder, or one without the marker, which :func:`is_built`
  refuses and the next builder replaces.  Leftovers of a killed builder are removed by the next one.
- A waiter retries the lock and reads the cache once it is complete.  A builder that died is taken over: at once on
  the same host (its pid is gone), after :data:`LEASE_SECONDS` without a heartbeat from another host (counted on the
  waiter's own clock, so the machines' clocks need not agree).  A builder that lives but does not finish within the
  timeout (``TUNER_CACHE_TIMEOUT`` seconds, default an hour) stops the waiter with :class:`BuildTimeout`, which names
  the cache, the builder and what to do.

The lock lives on the cache's own filesystem: machines with separate disks each build their own copy.  Two builders
can still overlap (one stalled past its lease, then resumed); each fills its own hidden folder and the cache stays
whole, so the worst case is work done twice, never a half cache read.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Callable, TypeVar

from tuner.fileio import atomic_write_text, staged_directory

log = logging.getLogger("tuner")

BUILT_MARKER = ".tuner-built"  # written last inside a cache folder: its presence means the folder is complete
LEASE_SECONDS = 60.0  # a lock not refreshed for this long (by a builder on another host) is taken over
HEARTBEAT_SECONDS = 10.0  # how often the builder refreshes its lock: well inside the lease, even behind NFS caching
TIMEOUT_VARIABLE = "TUNER_CACHE_TIMEOUT"
DEFAULT_TIMEOUT = 3600.0  # seconds a waiter waits for a live builder
_RETRY_SECONDS = 1.0  # between a waiter's looks at the cache

T = TypeVar("T")


class BuildTimeout(TimeoutError):
    """Another process has held a cache's lock, alive, for longer than this one would wait; ``str()`` says which
    process, where, and what to do (an environment error: exit 1)."""


def is_built(target: str | os.PathLike, spec: str | None = None) -> bool:
    """Whether the cache folder ``target`` is complete (its builder wrote :data:`BUILT_MARKER` into it last) and,
    given ``spec``, was built from that spec (a cache whose inputs changed since, e.g. by an upgrade of tuner, is
    not current: it is built again).

    The marker is opened, not looked up with stat: NFS promises a fresh view on open (close-to-open consistency),
    while a stat may answer from the client's attribute cache."""
    try:
        with open(Path(target) / BUILT_MARKER, "rb") as marker:
            text = marker.read()
    except OSError:
        return False
    if spec is None:
        return True
    try:
        return json.loads(text).get("spec") == spec
    except (ValueError, AttributeError):  # a marker from before specs, or damaged: not known to be current
        return False


def lock_path(target: str | os.PathLike) -> Path:
    """The lock a cache's builder holds: ``.NAME.lock`` beside it, on the same filesystem."""
    target = Path(target)
    return target.parent / f".{target.name}.lock"


def wait_timeout() -> float:
    """How long a waiter waits for a live builder: ``TUNER_CACHE_TIMEOUT`` seconds, or :data:`DEFAULT_TIMEOUT`."""
    configured = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    try:
        return float(configured) if configured else DEFAULT_TIMEOUT
    except ValueError:
        log.warning("%s=%r is not a number of seconds; waiting %d s", TIMEOUT_VARIABLE, configured, DEFAULT_TIMEOUT)
        return DEFAULT_TIMEOUT


def build_once(target: str | os.PathLike, build: Callable[[Path], T], *, what: str, spec: str | None = None,
               timeout: float | None = None, lease: float = LEASE_SECONDS) -> T | None:
    """Make sure the cache folder ``target`` is built, by this process or by whichever process sharing its
    filesystem got there first, and return only once it is complete.

    ``build(staging)`` fills ``staging``, an empty hidden folder beside ``target`` that becomes ``target`` when
    ``build`` returns; if it raises, nothing is published and the error propagates (the next caller tries again).
    Returns what ``build`` returned when this process built the cache, None when it was built already or by
    another process.  ``what`` names the cache in messages ("the built-in demo model").  ``spec`` (a digest of what
    the cache is built from) is kept in the marker; a complete cache of another spec is built again, in place.
    ``timeout`` (seconds,
    default :func:`wait_timeout`) bounds the wait for a live builder; ``lease`` must be the same for every process
    sharing the cache (tests shorten it).  Raises :class:`BuildTimeout`, or OSError when the lock or the cache cannot
    be written (a read-only or full home).
    """
    from filelock import SoftFileLease, Timeout

    target = Path(target)
    if is_built(target, spec):
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = SoftFileLease(lock_path(target), lease_duration=lease, heartbeat_interval=min(HEARTBEAT_SECONDS, lease / 3),
                         poll_interval=min(_RETRY_SECONDS / 4, lease / 6))
    timeout = wait_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    seen = None  # the builder this process is waiting for
    patience = 0.0  # one attempt first: the builder is named before a lease can run out
    while True:
        try:
            lock.acquire(timeout=patience)
            break
        except Timeout:
            patience = min(_RETRY_SECONDS, lease / 3)
            if is_built(target, spec):
                return None
            record = lock.owner  # filelock's owner record of the lock; None while unreadable
            owner = None if record is None else _process(record.pid, record.hostname)
            if owner != seen and owner is not None:
                log.info("waiting for %s in %s: %s is building it", what, target, owner)
                seen = owner
            if time.monotonic() > deadline:
                raise BuildTimeout(_stalled(what, target, owner, timeout)) from None
    try:
        if is_built(target, spec):
            return None
        if seen is not None:
            log.info("%s did not finish %s (it failed or was stopped); building it here", seen, what)
        elif is_built(target):
            log.info("%s in %s was built from other inputs (an earlier tuner); building it again", what, target)
        _remove_leftovers(target, what)
        log.info("building %s in %s (%s)", what, target, _process(os.getpid(), socket.gethostname()))
        with staged_directory(target, existing="replace") as staging:
            value = build(staging)
            atomic_write_text(staging / BUILT_MARKER, json.dumps(
                {"host": socket.gethostname(), "pid": os.getpid(), "built": time.time(), "spec": spec}) + "\n")
        return value
    finally:
        lock.release()


def _process(pid: int, host: str) -> str:
    return f"pid {pid} on host {host}"


def _stalled(what: str, target: Path, owner: str | None, waited: float) -> str:
    builder = owner or "another process"
    return (f"{what} in {target} is still not built after {waited:.0f} s: {builder} holds its lock "
            f"({lock_path(target)}) and keeps it fresh, so it is alive but has not finished. If that process is stuck, "
            f"stop it (the next run builds the cache again); to wait longer, set {TIMEOUT_VARIABLE} (seconds).")


def _remove_leftovers(target: Path, what: str) -> None:
    """Remove the hidden folders that builders of ``target`` killed mid-build left beside it (the lock is held, so
    no live builder is filling one, short of one stalled past its lease)."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(old\.)?[A-Za-z0-9_]+\.tmp")
    for leftover in target.parent.iterdir():
        if pattern.fullmatch(leftover.name):
            log.info("removing %s: left by a build of %s that did not finish", leftover, what)
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
