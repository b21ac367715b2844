"""Atomic file writes: a temporary file in the same directory, then a rename.

A crash between the two leaves the old file (or nothing), never half a file.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path


def _umask() -> int:
    umask = os.umask(0)  # the only way to read it; set straight back
    os.umask(umask)
    return umask


def _default_mode(path: Path) -> int:
    """Keep an existing file's permissions; a new file gets what open() would give it (0666 less the umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (best effort: not every filesystem allows opening a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    path = Path(path)
    try:
        return _write_then_rename(path, text, mode)
    except OSError as exc:
        if exc.errno and (not exc.filename or Path(exc.filename).name.startswith(f".{path.name}.")):
            # name the file the user asked for, not the temporary one (write and fsync name none)
            raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
        raise


def _write_then_rename(path: Path, text: str, mode: int | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, _default_mode(path) if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)
    return path


def create_exclusive_text(path: str | os.PathLike, text: str) -> Path:
    """Create ``path`` holding ``text`` only if nothing is there yet (FileExistsError otherwise), whole or not at
    all: the text is written to a temporary file first and then hard-linked into place, which fails if the name
    exists.  Two processes racing for the same name: exactly one wins, and nobody reads a half-written file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def atomic_write_directory(directory: str | os.PathLike, files: dict[str, str],
                           modes: dict[str, int] | None = None) -> Path:
    """Create ``directory`` holding ``files`` (name -> text) all at once, or not at all.

    The files are written into a hidden sibling directory that is then renamed into place, so a
    crash or a full disk half-way leaves no directory that looks like a run.  ``directory`` must
    not exist yet (an existing one is rewritten file by file with :func:`atomic_write_text`).
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
    try:
        os.chmod(staging, 0o777 & ~_umask())
        for name, text in files.items():
            atomic_write_text(staging / name, text, mode=(modes or {}).get(name))
        os.rename(staging, directory)  # fails if directory appeared meanwhile: never merges into it
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if exc.filename and str(exc.filename).startswith(str(staging)):  # name the files the user will look for
            raise type(exc)(exc.errno, exc.strerror, str(directory) + str(exc.filename)[len(str(staging)):]) from exc
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _sync_directory(directory.parent)
    return directory


_OS_ERROR_ADVICE = {
    errno.ENOSPC: "free some space, or point output.dir at a disk with room",
    errno.EDQUOT: "your disk quota is full: free some space, or point output.dir elsewhere",
    errno.EROFS: "the filesystem is read-only: point output.dir at a writable directory",
    errno.EACCES: "you may not write there: point output.dir at a directory you own",
    errno.EPERM: "you may not write there: point output.dir at a directory you own",
}


def os_error_message(exc: OSError) -> str:
    """A filesystem failure (disk full, read-only, no permission) as one line that says what to do."""
    where = f"{exc.filename}: " if exc.filename else ""
    advice = _OS_ERROR_ADVICE.get(exc.errno or 0)
    return f"{where}{exc.strerror or exc}" + (f"; {advice}." if advice else ".")
