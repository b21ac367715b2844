"""Which files in a folder tuner wrote, proved by their bytes, never guessed from their names.

Every folder tuner writes (a run directory, a probe's folder, a merged model, an export, ``tuner presets cp``'s
folder) gets :data:`~tuner.rundir.layout.MANIFEST` last and atomically, as pip's RECORD or dpkg's conffiles: each
file tuner wrote there with its size and SHA-256 (files over :data:`MAX_HASHED_BYTES`, weights, with the size and
the cheap structural check a checkpoint records, :func:`tuner.rundir.integrity.file_record`).  A file is tuner's only
while the manifest lists it and its bytes still match; anything else (a file under one of tuner's names with the
user's bytes, a link, a folder, a file tuner wrote and the user then edited) is the user's, and no command replaces or
deletes it, ``--force`` included.  A folder written by an older tuner, which kept no such record, is taken on only
by ``tuner adopt DIR`` once the user has looked (:func:`adopt`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
from fnmatch import fnmatch
from pathlib import Path
from typing import Callable, Iterable

from tuner.fileio import DIRECTORY, FILE, MAX_NAMED, DestinationRefused, atomic_write_text, entry_kind
from tuner.rundir.integrity import file_record, file_sha256, read_json
from tuner.rundir.layout import (
    LOCK_FILE,
    MANIFEST,
    MODEL_SNAPSHOT,
    PREVIOUS_RUNS_DIR,
    PROBE_DIR,
    PROBE_REPORT,
    PROBE_REQUEST,
    RENDERED_FILES,
    RUN_LOCK,
    RUN_OUTPUT_DIRS,
    RUN_OUTPUT_FILES,
    SLURM_LOG,
)

MAX_HASHED_BYTES = 64 * 1024 * 1024  # rendered files, configs, tokenizers: hashed; larger ones (weights) are not read through
ADOPT = "tuner adopt"
# what tuner itself (not the ranks, which append as they go) adds to a run directory it wrote, recorded with :func:`amend`
# as it writes them: proved like the rendered files, never kept by name
RECORDED_OUTPUTS = (MODEL_SNAPSHOT, PROBE_REQUEST, PROBE_REPORT)


def text_record(text: str) -> dict:
    """The record of a file about to be written with ``text`` (as :func:`~tuner.fileio.atomic_write_text` writes it)."""
    data = text.encode("utf-8")
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def path_record(path: Path) -> dict:
    """The record of a file on disk: size and SHA-256, or for a large one what a checkpoint records."""
    size = os.lstat(path).st_size
    return {"size": size, "sha256": file_sha256(path)} if size <= MAX_HASHED_BYTES else file_record(path)[0]


def manifest_text(records: dict[str, dict], written_by: str) -> str:
    return json.dumps({"written_by": written_by, "files": dict(sorted(records.items()))}, indent=2) + "\n"


def write_manifest(folder: Path, records: dict[str, dict], written_by: str) -> Path:
    """Write the manifest (last, atomically): ``records`` is name -> :func:`text_record` or :func:`path_record`."""
    return atomic_write_text(Path(folder) / MANIFEST, manifest_text(records, written_by))


def record_files(folder: Path, names: Iterable[str], written_by: str) -> Path:
    """Write the manifest of ``folder`` listing the files ``names`` as they are now on disk."""
    return write_manifest(folder, {name: path_record(Path(folder) / name) for name in names}, written_by)


def amend(folder: Path, written: Iterable[str] = (), removed: Iterable[str] = ()) -> Path:
    """Record in ``folder``'s manifest the files just ``written`` there (as they are now) and forget the ``removed``
    ones: a file tuner adds to a folder it wrote (:data:`RECORDED_OUTPUTS`)."""
    folder = Path(folder)
    data, _ = read_json(folder / MANIFEST)
    records = {name: record for name, record in (read_manifest(folder) or {}).items() if name not in set(removed)}
    records.update({name: path_record(folder / name) for name in written})
    written_by = data.get("written_by") if isinstance(data, dict) and isinstance(data.get("written_by"), str) else "tuner"
    return write_manifest(folder, records, written_by)


def _plain_name(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..", MANIFEST) and "/" not in name and "\0" not in name


def read_manifest(folder: Path) -> dict[str, dict] | None:
    """name -> record from ``folder``'s manifest; None when there is none, or not one this tuner wrote (an older
    tuner's list of names, a damaged or foreign file, a link)."""
    path = Path(folder) / MANIFEST
    if not path.is_file() or path.is_symlink():
        return None
    data, problem = read_json(path)
    files = data.get("files") if isinstance(data, dict) and problem is None else None
    if not isinstance(files, dict) or not all(
            _plain_name(name) and isinstance(record, dict) and type(record.get("size")) is int
            for name, record in files.items()):
        return None
    return files


def matches(path: Path, record: dict) -> bool:
    """Whether ``path`` (a link not followed) is the very file ``record`` describes: a plain file, same size, same
    SHA-256 (a large one: its structure still whole, as a checkpoint is judged)."""
    try:
        found = os.lstat(path)
        if not stat.S_ISREG(found.st_mode) or found.st_size != record["size"]:
            return False
        if "sha256" in record:
            return path_record(path).get("sha256") == record["sha256"]
        return record["size"] > MAX_HASHED_BYTES and file_record(path)[1] is None
    except OSError:
        return False


def proved(folder: Path, records: dict[str, dict] | None = None) -> dict[str, dict]:
    """The records of the files in ``folder`` its manifest proves tuner wrote (present, bytes unchanged)."""
    records = read_manifest(folder) if records is None else records
    return {name: record for name, record in (records or {}).items() if matches(Path(folder) / name, record)}


def _shown(entry: Path, listed: bool) -> str:
    kind = entry_kind(entry)
    if listed and kind == FILE:
        return f"{entry.name} (changed since tuner wrote it)"
    return entry.name if kind == FILE else f"{entry.name} ({kind})"


def foreign_entries(folder: Path, kept: Callable[[Path, bool], bool] = lambda entry, owned: False) -> list[str]:
    """What in ``folder`` tuner cannot prove it wrote, as shown to the user: every entry but the manifest, the files it
    proves, and what ``kept(entry, owned)`` accepts (``owned``: the folder has a manifest of this tuner's)."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return []
    records = read_manifest(folder)
    foreign = []
    for entry in sorted(folder.iterdir()):
        if records is not None and entry.name == MANIFEST:
            continue
        listed = records is not None and entry.name in records
        if listed and matches(entry, records[entry.name]):
            continue
        if not listed and kept(entry, records is not None):
            continue
        foreign.append(_shown(entry, listed))
    return foreign


def looks_older(folder: Path) -> bool:
    """Whether ``folder`` was written by a tuner that kept no manifest: a run directory (its lock recipe, no manifest)
    or a merged model or export (a manifest that is only a list of names)."""
    folder = Path(folder)
    if read_manifest(folder) is not None:
        return False
    if (folder / LOCK_FILE).is_file() and not (folder / LOCK_FILE).is_symlink():
        return True
    data, problem = read_json(folder / MANIFEST) if (folder / MANIFEST).is_file() else (None, "none")
    return problem is None and isinstance(data, dict) and isinstance(data.get("files"), list)


def _listed(names: list[str]) -> str:
    return ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")


def _older_message(folder: Path) -> str:
    return (f"{folder}: written by an older tuner, which kept no {MANIFEST} (the record of the files tuner wrote), so "
            f"tuner cannot tell its files from yours there. Look through the folder, then run `{ADOPT} "
            f"{shlex.quote(str(folder))}` to record its files as tuner's, and run this again (or choose another folder).")


def check_owned(folder: Path, kept: Callable[[Path, bool], bool] = lambda entry, owned: False) -> None:
    """Refuse (:class:`~tuner.fileio.DestinationRefused`) a folder holding anything tuner cannot prove it wrote there,
    in every mode, ``--force`` included: an older tuner's folder with the command that adopts it, any other with the
    entries named.  A new or empty folder passes."""
    foreign = foreign_entries(folder, kept)
    if not foreign:
        return
    if looks_older(folder):
        raise DestinationRefused(_older_message(folder))
    raise DestinationRefused(f"{folder}: holds files tuner did not write ({_listed(foreign)}); tuner replaces only "
                             f"files it can prove it wrote (listed in the folder's {MANIFEST} with the same size and "
                             "SHA-256), even with --force. Choose another folder, or move those files away.")


def _temporary(name: str, owners: Iterable[str]) -> bool:
    """A hidden temporary file or folder of tuner's that a kill left behind (``.recipe.lock.yaml.x1y2.tmp``)."""
    return name.endswith(".tmp") and any(name.startswith(f".{own}.") for own in owners)


def _probe_lock(name: str) -> bool:
    return name == f".{PROBE_DIR}{RUN_LOCK}"


def run_output(entry: Path, owned: bool) -> bool:
    """What ``check_owned`` keeps in a run directory besides the files its manifest proves: in a run directory tuner
    wrote (``owned``), what the ranks add to it as they go, which no manifest could record (events, log, memory
    report, checkpoints/, final/ ..., Slurm's logs, earlier runs in previous/, a kill's temporary files), each of the
    kind tuner writes (never a link), none of which a render replaces or deletes; in any folder, a probe's folder proved by its own manifest and the lock beside it."""
    kind = entry_kind(entry)
    if entry.name == PROBE_DIR and kind == DIRECTORY and read_manifest(entry) is not None:
        return True
    if _probe_lock(entry.name) and kind == FILE:
        return True
    if not owned:
        return False
    files = tuple(name for name in RUN_OUTPUT_FILES if name not in RECORDED_OUTPUTS)
    if kind == FILE and (entry.name in files or fnmatch(entry.name, SLURM_LOG.replace("%j", "*"))):
        return True
    if kind == DIRECTORY and (entry.name in RUN_OUTPUT_DIRS or entry.name == PREVIOUS_RUNS_DIR):
        return True
    return kind in (FILE, DIRECTORY) and _temporary(entry.name, (*RENDERED_FILES, *RUN_OUTPUT_FILES,
                                                                      *RUN_OUTPUT_DIRS, MANIFEST))


def adopt(folder: Path) -> list[str]:
    """Record an older tuner's files in ``folder`` as tuner's (``tuner adopt``), after the user has looked: a run
    directory's rendered files and :data:`RECORDED_OUTPUTS`, or the files an older merge or export listed.  Refused when the
    folder is not an older tuner's, or holds anything such a tuner never wrote there (named: move it away first)."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        raise DestinationRefused(f"{folder}: not a folder; give the run directory (or merged/export folder) to adopt.")
    if read_manifest(folder) is not None:
        raise DestinationRefused(f"{folder}: already has its {MANIFEST}; nothing to adopt.")
    if not looks_older(folder):
        raise DestinationRefused(f"{folder}: not a folder an older tuner wrote (no {LOCK_FILE}, no list of files in "
                                 f"{MANIFEST}); tuner adopts only its own run directories, merged models and exports.")
    data, problem = read_json(folder / MANIFEST) if os.path.lexists(folder / MANIFEST) else ({}, None)
    older_list = problem is None and isinstance(data, dict) and isinstance(data.get("files"), list)
    if os.path.lexists(folder / MANIFEST) and (entry_kind(folder / MANIFEST) != FILE or not older_list):
        raise DestinationRefused(f"{folder / MANIFEST}: not a record tuner can read ({_shown(folder / MANIFEST, False)}"
                                 "); it is never replaced: move it away, then adopt the folder.")
    if older_list:  # an older merge or export
        wanted = {name for name in data["files"] if _plain_name(name)}
        written_by = f"{ADOPT} ({data.get('written_by', 'an older tuner')})"
        kept = lambda entry, owned: False  # noqa: E731 - the listed files are the whole folder
    else:
        wanted = {*RENDERED_FILES, *RECORDED_OUTPUTS}
        written_by, kept = f"{ADOPT} (an older tuner's run)", run_output
    names = sorted(entry.name for entry in folder.iterdir() if entry.name in wanted and entry_kind(entry) == FILE)
    others = [_shown(entry, False) for entry in sorted(folder.iterdir())
              if entry.name not in names and entry.name != MANIFEST and not kept(entry, True)]
    if others:
        raise DestinationRefused(f"{folder}: holds what no tuner writes there ({_listed(others)}); move those away "
                                 "first, then adopt it.")
    record_files(folder, names, written_by)
    return names
