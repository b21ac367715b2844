"""What a disk's refusal means to the user, in one line: full (or its quota), read-only, not theirs to write; and
sizes and the room left as those lines say them.

A full disk is recognised however it reaches Python: an OSError's errno, or the words of a writer that raises no
OSError (torch.save's C++ writer, safetensors' Rust one).
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path


_OS_ERROR_ADVICE = {
    errno.ENOSPC: "free some space, or point output.dir at a disk with room",
    errno.EDQUOT: "your disk quota is full: free some space, or point output.dir elsewhere",
    errno.EROFS: "the filesystem is read-only: point output.dir at a writable directory",
    errno.EACCES: "you may not write there: point output.dir at a directory you own",
    errno.EPERM: "you may not write there: point output.dir at a directory you own",
}


def os_error_message(exc: OSError) -> str:
    """A filesystem failure (disk full, read-only, no permission) as one line that says what to do; a full disk
    with the room left where the file was written."""
    where = f"{exc.filename}: " if exc.filename else ""
    advice = _OS_ERROR_ADVICE.get(exc.errno or 0)
    told = str(exc.strerror or exc)
    if exc.filename and exc.errno in _FULL:
        told += f" ({free_space(exc.filename)} free)"
    return f"{where}{told}" + (f"; {advice}." if advice else "" if told.endswith(".") else ".")


_FULL = (errno.ENOSPC, errno.EDQUOT)
# how a full disk reads where no OSError reaches Python: torch.save's C++ writer, safetensors' Rust one
_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "StorageFull", "unexpected pos", "file write failed")
DECIMAL_MB = 10 ** 6


def disk_size(count: float) -> str:
    """A size on disk for a message: GiB, or MB below 0.1 GiB (where "0.0 GiB" would say nothing)."""
    return f"{count / 2 ** 30:.1f} GiB" if count >= 0.1 * 2 ** 30 else f"{count / DECIMAL_MB:.1f} MB"


def existing_parent(path: str | os.PathLike) -> Path:
    """``path`` or its nearest folder that exists: where a file to be written there would land."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_space(path: str | os.PathLike) -> str:
    """The room left on the filesystem ``path`` is (or would be) on, as :func:`disk_size` says it."""
    try:
        return disk_size(shutil.disk_usage(existing_parent(path)).free)
    except OSError:
        return "an unknown amount"


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it arose from, is a write that found the disk (or quota) full."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL or any(text in str(current) for text in _FULL_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


def disk_full_message(path: str | os.PathLike, exc: BaseException) -> str:
    """One line for a write under ``path`` that found the disk full, with the room left there now."""
    named = next((e.filename for e in (exc, exc.__context__) if isinstance(e, OSError) and e.filename), None)
    return (f"{named or path}: the disk is full ({free_space(named or path)} free) and the write failed; "
            f"{_OS_ERROR_ADVICE[errno.ENOSPC]}.")
