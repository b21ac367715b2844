"""Is a checkpoint whole?  Judged from its files alone (no torch), before any rank tries to load it.

The Trainer writes a checkpoint in place: weights, then optimizer/scheduler/RNG state, then
``trainer_state.json`` last.  A crash, a kill or a full disk in between leaves a directory that looks
like the newest checkpoint but fails (or silently misloads) on resume; this module says what is wrong
with one, and :mod:`tuner.launch.checkpoints` skips such checkpoints on resume.
"""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

TRAINER_STATE = "trainer_state.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _safetensors_problem(path: Path) -> str | None:
    """The header says where every tensor ends; a shorter file was cut off while being written."""
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
        except ValueError:
            return "damaged header"
    end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
    if size < 8 + length + end:
        return f"truncated ({size} of {8 + length + end} bytes)"
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
    return None
