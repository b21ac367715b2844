"""Is a checkpoint whole?  Judged from its files alone (no torch), before any rank tries to load it.

The Trainer writes a checkpoint in place: weights, then optimizer/scheduler/RNG state, then
``trainer_state.json`` last.  A crash, a kill or a full disk in between leaves a directory that looks
like the newest checkpoint but fails (or silently misloads) on resume; this module says what is wrong
with one, and :mod:`tuner.launch.checkpoints` skips such checkpoints on resume.
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
import zipfile
from pathlib import Path

from tuner.run_layout import CHECKPOINT_INFO

TRAINER_STATE = "trainer_state.json"
# bytes per element of each safetensors dtype (the format's own names)
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "C64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _safetensors_problem(path: Path) -> str | None:
    """The header says where every tensor lies; a file cut short, or a header whose offsets, shapes and dtypes do not
    tile the data exactly, was damaged (even when its size is right)."""
    size = path.stat().st_size
    with open(path, "rb") as stream:
        head = stream.read(8)
        if len(head) < 8:
            return "truncated (no header)"
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            return "truncated (header cut off)"
        try:
            header = json.loads(stream.read(length))
        except (ValueError, RecursionError):
            return "damaged header"
    if not isinstance(header, dict):
        return "damaged header"
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(offset) for offset in entry["data_offsets"])
            elements = math.prod(int(dim) for dim in entry["shape"])
            width = _DTYPE_BYTES.get(entry["dtype"])
        except (KeyError, TypeError, ValueError):
            return f"damaged header (entry {name!r} unreadable)"
        if width is not None and end - begin != elements * width:
            return f"damaged header ({name}: {entry['dtype']} {entry['shape']} does not fill {end - begin} bytes)"
        spans.append((begin, end))
    spans.sort()
    if any(begin != previous for (begin, _), previous in zip(spans, [0] + [end for _, end in spans])):
        return "damaged header (tensor data overlaps or leaves gaps)"
    end = spans[-1][1] if spans else 0
    if size < 8 + length + end:
        return f"truncated ({size} of {8 + length + end} bytes)"
    if size > 8 + length + end:
        return f"damaged header (the tensors end at byte {8 + length + end} of {size})"
    return None


def _torch_file_problem(path: Path) -> str | None:
    """torch.save writes a zip archive whose directory comes last: a cut-off file has none."""
    with open(path, "rb") as stream:
        if stream.read(2) != b"PK":
            return None if path.stat().st_size else "empty"  # a legacy pickle: nothing to check cheaply
    try:
        with zipfile.ZipFile(path):
            return None
    except (zipfile.BadZipFile, OSError):
        return "truncated (its zip directory is missing)"


def _file_problem(path: Path) -> str | None:
    if path.suffix == ".safetensors":
        return _safetensors_problem(path)
    if path.suffix in (".pt", ".bin", ".pth"):
        return _torch_file_problem(path)
    if path.suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return "truncated or damaged JSON"
    return None


def _weights_problem(directory: Path) -> str | None:
    for index_name in WEIGHT_INDEXES:
        index = directory / index_name
        if index.is_file():
            shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
            missing = sorted(shard for shard in shards if not (directory / shard).is_file())
            return f"shards missing: {', '.join(missing)}" if missing else None
    if any((directory / name).is_file() for name in WEIGHT_FILES):
        return None
    if (directory / "latest").is_file() and any(directory.glob("global_step*")):
        return None  # DeepSpeed's own layout: model states live in global_step*/
    return "no model weights"


def file_digests(directory: Path) -> dict[str, dict]:
    """Size and SHA-256 of every file in a checkpoint (relative path -> {size, sha256}), but its tuner info file:
    recorded when it is saved, so a resume can tell a file that changed since, whatever its size."""
    digests = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != CHECKPOINT_INFO:
            with open(path, "rb") as stream:
                digest = hashlib.file_digest(stream, "sha256").hexdigest()
            digests[path.relative_to(directory).as_posix()] = {"size": path.stat().st_size, "sha256": digest}
    return digests


def _digest_problem(directory: Path) -> str | None:
    """The first file that differs from what the info file recorded at save time (none recorded: nothing to check)."""
    info = directory / CHECKPOINT_INFO
    if not info.is_file():
        return None
    try:
        recorded = json.loads(info.read_text(encoding="utf-8")).get("files") or {}
    except (ValueError, AttributeError, UnicodeDecodeError):
        return f"{CHECKPOINT_INFO}: truncated or damaged JSON"
    for name, expected in sorted(recorded.items()):
        path = directory / name
        if not path.is_file():
            return f"{name}: missing"
        if path.stat().st_size != expected.get("size"):
            return f"{name}: {path.stat().st_size} bytes, saved as {expected.get('size')}"
        with open(path, "rb") as stream:
            if hashlib.file_digest(stream, "sha256").hexdigest() != expected.get("sha256"):
                return f"{name}: changed since it was saved (its SHA-256 differs)"
    return None


def checkpoint_problem(directory: str | Path) -> str | None:
    """None when the checkpoint is complete; otherwise the first thing wrong with it, naming the file."""
    directory = Path(directory)
    if not directory.is_dir():
        return "not a directory"
    if not (directory / TRAINER_STATE).is_file():
        return f"{TRAINER_STATE} missing (the save did not finish)"
    try:
        problem = _weights_problem(directory)
    except (ValueError, OSError) as exc:
        problem = f"weight index unreadable: {exc}"
    if problem:
        return problem
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            why = _file_problem(path)
            if why:
                return f"{path.relative_to(directory)}: {why}"
    return _digest_problem(directory)
