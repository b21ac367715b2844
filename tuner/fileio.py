"""Atomic file writes (a temporary file in the same directory, then a rename) and bounded reads.

A crash between write and rename leaves the old file (or nothing), never half a file.  Inputs are read up to
a limit and no further, and devices (/dev/zero) are refused before a byte is read.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, TextIO


class TooLarge(ValueError):
    """An input is longer than its limit; nothing past the limit was read."""


class NotARegularFile(OSError):
    """An input that is a directory, a device, a socket (or, where refused, a pipe): reading it could never end
    (/dev/zero), never start, or means nothing."""

    def __init__(self, path: str | os.PathLike, kind: str):
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", str(path))
        self.kind = kind


FILE, DIRECTORY, LINK = "a file", "a directory", "a symbolic link"  # the kinds of entry tuner writes
_SPECIAL = ((stat.S_ISDIR, DIRECTORY), (stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a device"),
            (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "true/false", type(None): "null"}


def json_kind(value) -> str:
    """What a parsed JSON value is, in a message's words ("a JSON list"), for a file or row that must be an object."""
    return f"a JSON {_JSON_KINDS.get(type(value), type(value).__name__)}"


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it is not a regular file ("a directory", "a pipe", "a device", "a socket"), else None."""
    mode = os.stat(path).st_mode  # follows links: /dev/stdin is whatever stdin is
    return next((kind for test, kind in _SPECIAL if test(mode)), None)


def user_path(text: str | os.PathLike) -> Path:
    """``text`` as a path with ``~`` and ``~user`` expanded, as a shell does: a user without a home (``~nouser``) is
    left as written (a relative name that will not be found), never an exception."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)


# characters that make a path show other than it is: a bidi control reorders the text after it (a terminal shows
# "run\u202egpj.sh" as "runhs.jpg"), a zero-width one is invisible; refused in every path tuner is given
_HIDDEN = {**dict.fromkeys(map(chr, [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]), "a bidirectional control"),
           **dict.fromkeys(map(chr, [*range(0x200B, 0x2010), 0x2060, 0xFEFF]), "a zero-width character")}
_ENVIRONMENT_VARIABLE = re.compile(r"\$(?:\{[A-Za-z_]\w*\}|[A-Za-z_]\w*)")


def hidden_character(text: str) -> str | None:
    """The first character of ``text`` that shows the path other than it is (:data:`_HIDDEN`), for a message."""
    found = next((character for character in text if character in _HIDDEN), None)
    return f"{_HIDDEN[found]} (U+{ord(found):04X})" if found else None


def hidden_character_problem(text: str) -> str | None:
    """Why ``text`` cannot be a path tuner takes: it holds a character that hides what the path is."""
    found = hidden_character(text)
    return (f"contains {found}, which makes a path show other than it is; remove it (retype the path)"
            if found else None)


def output_folder(text: str) -> str:
    """A folder tuner is to write, as the user meant it: ``~`` and ``~user`` expanded as for a model folder; a
    ``$VAR`` left unexpanded (quoted in the shell, or written in YAML) or a ``~`` that names no home refused, with
    the reason (:class:`ValueError`) -- tuner would otherwise create a folder named ``$HOME`` or ``~``."""
    problem = hidden_character_problem(text)
    if problem:
        raise ValueError(problem)
    variable = _ENVIRONMENT_VARIABLE.search(text)
    if variable:
        raise ValueError(f"holds {variable.group(0)}, an environment variable tuner does not expand (it was quoted, "
                         f"or written in a file); write the folder itself, e.g. with the shell's $HOME unquoted")
    path = user_path(text)
    if path.parts and path.parts[0].startswith("~"):
        raise ValueError(f"starts with {path.parts[0]!r}, which names no user's home here; write the folder itself")
    if "~" in path.parts:
        raise ValueError("has a folder named '~', which a shell reads as your home; write the folder itself")
    return str(path)


def entry_kind(path: str | os.PathLike) -> str:
    """What ``path`` itself is, a link not followed: :data:`FILE`, :data:`DIRECTORY`, :data:`LINK`, or a special
    file's kind ("a pipe", ...)."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return LINK
    if stat.S_ISREG(mode):
        return FILE
    return next((kind for test, kind in _SPECIAL if test(mode)), "a special file")


def open_input(path: str | os.PathLike, pipes: bool = True):
    """Open an input for reading in binary: a regular file, or a pipe when ``pipes``; anything else is refused
    (:class:`NotARegularFile`) before a byte is read."""
    kind = special_kind(path)
    if kind and not (pipes and kind == "a pipe"):
        raise NotARegularFile(path, kind)
    return open(path, "rb")


def read_limited(path: str | os.PathLike, limit: int, pipes: bool = True) -> bytes:
    """The whole of a file (or pipe) of at most ``limit`` bytes; :class:`TooLarge` once it goes past, having read
    ``limit + 1`` bytes and no more."""
    with open_input(path, pipes) as stream:
        data = stream.read(limit + 1)  # a buffered read waits for the bytes or the end of a pipe
    if len(data) > limit:
        raise TooLarge(f"{path}: more than {limit} bytes")
    return data


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


def _synced_temporary(path: Path, text: str, mode: int) -> str:
    """``text`` in a hidden temporary file beside ``path``, synced to disk with ``mode``; the caller moves it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _write_then_rename(path: Path, text: str, mode: int | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _synced_temporary(path, text, _default_mode(path) if mode is None else mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)
    return path


@contextmanager
def streamed_text(path: str | os.PathLike) -> Iterator[TextIO]:
    """``path`` opened for text written as it comes (answers line by line: what was written survives a stop half-way,
    where a rename at the end would lose it all).  Never through a symbolic link, never into a device or a pipe; a
    file being replaced keeps its permissions.  The caller decides whether ``path`` may be replaced."""
    with os.fdopen(_regular_file(Path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as stream:
        yield stream
        stream.flush()
        os.fsync(stream.fileno())


def open_log(path: str | os.PathLike, fresh: bool = False, binary: bool = False, errors: str = "strict") -> IO:
    """``path`` opened for a log written as things happen (a run's train.log and events, the libraries' log, the
    wizard's tui.log): appended to, or begun afresh with ``fresh``.  As :func:`streamed_text`, never through a
    symbolic link and never into a device or a pipe, so a link planted at a log's name receives nothing
    (:class:`NotARegularFile`, an OSError)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if fresh else os.O_APPEND)
    fd = _regular_file(Path(path), flags)
    return os.fdopen(fd, "wb") if binary else os.fdopen(fd, "a", encoding="utf-8", errors=errors)


def _regular_file(path: Path, flags: int) -> int:
    """A descriptor of ``path`` opened with ``flags`` for writing: never through a symbolic link (refused as one),
    never a device, a pipe or a folder (O_NONBLOCK: opening a FIFO with no reader must not hang)."""
    try:
        fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARegularFile(path, LINK) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotARegularFile(path, special_kind(path) or "a special file")
    os.set_blocking(fd, True)
    return fd


def write_control_file(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a kernel's control file (``/proc/self/clear_refs``): a command to the kernel, not a file
    with content to keep, so it is written in place (a rename cannot reach /proc)."""
    with open(path, "w", encoding="ascii") as control:
        control.write(text)


def create_exclusive_text(path: str | os.PathLike, text: str) -> Path:
    """Create ``path`` holding ``text`` only if nothing is there yet (FileExistsError otherwise), whole or not at
    all: the text is written to a temporary file first and then hard-linked into place, which fails if the name
    exists.  Two processes racing for the same name: exactly one wins, and nobody reads a half-written file."""
    path = Path(path)
    tmp = _synced_temporary(path, text, 0o666 & ~_umask())
    try:
        os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def _staging_for(directory: Path, role: str = "") -> Path:
    """A new hidden sibling of ``directory`` (same filesystem, so a rename moves it); its permissions follow the umask.
    A failure names ``directory``, the folder the user asked for, not the hidden one."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.{role}", suffix=".tmp", dir=directory.parent))
        os.chmod(staging, 0o777 & ~_umask())
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, str(directory)) from exc
    return staging


def _named(exc: OSError, staging: Path, directory: Path) -> OSError:
    """The error with a path inside ``staging`` written as the path inside ``directory`` the user will look for."""
    if exc.filename and str(exc.filename).startswith(str(staging)):
        return type(exc)(exc.errno, exc.strerror, str(directory) + str(exc.filename)[len(str(staging)):])
    return exc


def umask_permissions(directory: str | os.PathLike) -> None:
    """Give everything under ``directory`` the permissions a plain save would (0666/0777 less the umask); libraries
    that write through temporary files (safetensors) leave 0600 behind.  Best effort: a file another user owns
    keeps its mode."""
    umask = _umask()
    for root, _, files in os.walk(directory):  # every folder is a root once
        for path in [root, *(os.path.join(root, name) for name in files)]:
            try:
                mode = os.stat(path).st_mode
                os.chmod(path, (0o777 if stat.S_ISDIR(mode) or mode & 0o111 else 0o666) & ~umask)
            except OSError:
                continue


@contextmanager
def staged_directory(directory: str | os.PathLike, existing: str = "refuse") -> Iterator[Path]:
    """A fresh hidden sibling of ``directory`` to fill; when the block ends without error, its files get the
    umask's permissions and it takes ``directory``'s place in one rename, so a crash or a full disk half-way
    leaves no half-written folder.  If ``directory`` exists by then: ``"refuse"`` fails (never merges into it),
    ``"replace"`` swaps the old one out and removes it after.  Whether an existing folder may be replaced is the caller's to check first (:func:`check_destination`)."""
    directory = Path(directory)
    staging = _staging_for(directory)
    try:
        yield staging
        umask_permissions(staging)
        if existing == "replace" and os.path.lexists(directory):
            old = _staging_for(directory, "old.")
            os.rename(directory, old)
            try:
                os.rename(staging, directory)
            except BaseException:
                os.rename(old, directory)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, directory)  # fails if directory appeared meanwhile (and holds anything)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _named(exc, staging, directory) from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _sync_directory(directory.parent)


def atomic_write_directory(directory: str | os.PathLike, files: dict[str, str],
                           modes: dict[str, int] | None = None) -> Path:
    """Create ``directory`` holding ``files`` (name -> text) all at once, or not at all.

    ``directory`` must not exist yet (:func:`replace_files` rewrites files in an existing one).
    """
    with staged_directory(directory) as staging:
        for name, text in files.items():
            atomic_write_text(staging / name, text, mode=(modes or {}).get(name))
    return Path(directory)


def replace_files(directory: str | os.PathLike, files: dict[str, str], modes: dict[str, int] | None = None,
                  remove: Iterable[str] = ()) -> Path:
    """Rewrite ``files`` in an existing ``directory`` and delete the names in ``remove``; nothing else in it is
    touched.  Every new file is written and synced in a hidden sibling before the first one is renamed into
    place, so a full disk changes nothing; a file being replaced keeps its permissions unless ``modes`` says."""
    directory = Path(directory)
    staging = _staging_for(directory)
    try:
        for name, text in files.items():
            atomic_write_text(staging / name, text, mode=(modes or {}).get(name, _default_mode(directory / name)))
        for name in files:
            os.replace(staging / name, directory / name)
        for name in remove:
            (directory / name).unlink(missing_ok=True)
    except OSError as exc:
        raise _named(exc, staging, directory) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _sync_directory(directory)
    return directory


class DestinationRefused(Exception):
    """A folder tuner will not write into or replace; ``str()`` is the message for the user (exit code 2)."""


MAX_NAMED = 5  # foreign files named in one message


Kinds = str | tuple[str, ...]  # the kind of entry tuner writes under a name, or the kinds it may be


def check_destination(directory: str | os.PathLike, *, owned: Callable[[str], Kinds | None] | None = None,
                      holding: Iterable[tuple[Path, str]] = (), inside: Iterable[tuple[Path, str]] = ()) -> None:
    """Refuse a folder tuner would write into or replace, before anything is written: a symbolic link, a file, the
    current folder or one above it, a folder that is or holds one of ``holding`` (path, what it is), one that is or
    lies inside one of ``inside``, or (with ``owned``: name -> the kind of entry tuner writes under that name, None
    for a name tuner never writes) one holding an entry that is not tuner's, or not of the kind tuner writes there
    (a folder where tuner writes a file, a link where it writes a folder: a link would lead tuner out of the folder
    it owns)."""
    directory = Path(directory)
    if directory.is_symlink():
        raise DestinationRefused(f"{directory}: is a symbolic link (to {os.readlink(directory)}); give the folder "
                                 "itself, or another.")
    if directory.exists() and not directory.is_dir():
        raise DestinationRefused(f"{directory}: is {entry_kind(directory)}, not a folder; choose another folder.")
    resolved = directory.resolve()
    for path, what in inside:
        path = path.resolve()
        if resolved == path or path in resolved.parents:
            relation = "is" if resolved == path else "is inside"
            raise DestinationRefused(f"{directory}: {relation} {what}; tuner will not write there. Choose another "
                                     "folder.")
    for path, what in [(Path.cwd(), "the current folder"), *holding]:
        path = path.resolve()
        if resolved == path or resolved in path.parents:
            relation = "is" if resolved == path else "holds"
            raise DestinationRefused(f"{directory}: {relation} {what}; tuner will not replace it. Choose a new folder.")
    if owned is not None and directory.is_dir():
        foreign = sorted(filter(None, (_not_owned(entry, owned(entry.name)) for entry in directory.iterdir())))
        if foreign:
            shown = ", ".join(foreign[:MAX_NAMED]) + (f" and {len(foreign) - MAX_NAMED} more" if len(foreign) > MAX_NAMED
                                                      else "")
            raise DestinationRefused(f"{directory}: holds files tuner did not write ({shown}); tuner replaces only "
                                     "what it wrote, even with --force. Choose another folder, or move those files "
                                     "away.")


def _not_owned(entry: Path, kinds: Kinds | None) -> str | None:
    """How ``entry`` is shown among the files tuner did not write (None: it is tuner's, of the kind tuner writes)."""
    if kinds is None:
        return entry.name
    kinds = (kinds,) if isinstance(kinds, str) else kinds
    found = entry_kind(entry)
    if found in kinds:
        return None
    return f"{entry.name} ({found}, where tuner writes {' or '.join(kinds)})"
