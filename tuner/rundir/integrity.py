"""Is a checkpoint, or a saved model folder, whole?  Judged from its files alone (no torch), before any rank or
loader tries to read it.

The Trainer writes a checkpoint in place: weights, then optimizer/scheduler/RNG state, then
``trainer_state.json`` last.  A crash, a kill or a full disk in between leaves a directory that looks
like the newest checkpoint but fails (or silently misloads) on resume; this module says what is wrong
with one, and :mod:`tuner.rundir.checkpoints` skips such checkpoints on resume.  The same file checks, and those of
the files a model folder holds (config, tokenizer, chat template, adapter settings), tell why a run's ``final/``
or a ``--model`` folder cannot be loaded, naming the file, before transformers fails on it somewhere inside.
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
import zipfile
from pathlib import Path

from tuner.fileio import TooLarge, json_kind, read_limited, special_kind
from tuner.rundir.layout import CHECKPOINT_INFO

TRAINER_STATE = "trainer_state.json"
# bytes per element of each safetensors dtype (the format's own names)
_SAFETENSORS_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "C64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                            "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
MAX_JSON_BYTES = 256 * 1024 * 1024  # a tokenizer.json of a large vocabulary is tens of MB
# files of a saved model that hold one JSON object; a list, a number or a string there is damage
JSON_OBJECTS = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                "adapter_config.json", "tokenizer.json", "preprocessor_config.json", "processor_config.json",
                CHECKPOINT_INFO, TRAINER_STATE, *WEIGHT_INDEXES)
CHAT_TEMPLATE_FILE = "chat_template.jinja"
READ_CHUNK = 8 * 1024 * 1024
ADAPTER_KIND = "LORA"  # the adapters tuner trains, merges and serves


def read_json(path: Path):
    """``(value, None)`` for a JSON file, or ``(None, what is wrong)``: cut short, not UTF-8, nested too deeply,
    larger than any such file tuner reads, or not a plain file (a pipe would never end)."""
    try:
        return json.loads(read_limited(path, MAX_JSON_BYTES, pipes=False)), None
    except TooLarge:
        return None, f"larger than {MAX_JSON_BYTES} bytes"
    except RecursionError:
        return None, "nested too deeply"
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except ValueError:
        return None, "truncated or damaged JSON"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"


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
            width = _SAFETENSORS_DTYPE_BYTES.get(entry["dtype"])
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


_WHOLE, _NUMBER = "a whole number", "a number"
# the fields of transformers 5.24's TrainerState, which resume builds as TrainerState(**json) (another key: a
# TypeError) and reads (global_step // steps per epoch, log_history, stateful_callbacks.items() ...), with the kind
# each must be; tests/test_checkpoints.py holds the names to TrainerState's own
TRAINER_STATE_FIELDS = {
    "epoch": _NUMBER, "global_step": _WHOLE, "max_steps": _WHOLE, "logging_steps": _NUMBER, "eval_steps": _NUMBER,
    "save_steps": _NUMBER, "train_batch_size": _WHOLE, "num_train_epochs": _NUMBER, "num_input_tokens_seen": _WHOLE,
    "total_flos": _NUMBER, "log_history": "a list of objects", "best_metric": _NUMBER, "best_global_step": _WHOLE,
    "best_model_checkpoint": "text", "is_local_process_zero": "true or false", "is_world_process_zero": "true or false",
    "is_hyper_param_search": "true or false", "trial_name": "text", "trial_params": "an object",
    "stateful_callbacks": "an object of objects (or lists of them)",
}
_NULLABLE = {"train_batch_size", "best_metric", "best_global_step", "best_model_checkpoint", "trial_name",
             "trial_params", "stateful_callbacks", "log_history"}


def _is_kind(value, kind: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == _WHOLE:
        return number and isinstance(value, int) and value >= 0
    if kind == _NUMBER:
        return number
    if kind == "a list of objects":
        return isinstance(value, list) and all(isinstance(entry, dict) for entry in value)
    if kind == "text":
        return isinstance(value, str)
    if kind == "true or false":
        return isinstance(value, bool)
    if kind == "an object":
        return isinstance(value, dict)
    return isinstance(value, dict) and all(  # stateful_callbacks
        isinstance(entry, dict) or (isinstance(entry, list) and all(isinstance(one, dict) for one in entry))
        for entry in value.values())


def trainer_state_problem(state: dict) -> str | None:
    """What in a ``trainer_state.json`` object resume cannot read: a key TrainerState has not, a field of the wrong
    kind, or no global_step (resume would silently start at step 0)."""
    if "global_step" not in state:
        return "has no global_step (the step to resume at)"
    for key, value in state.items():
        kind = TRAINER_STATE_FIELDS.get(key)
        if kind is None:
            return f"has a key {key[:40]!r} that transformers' TrainerState does not read"
        if not (value is None and key in _NULLABLE) and not _is_kind(value, kind):
            shown = repr(value)[:40] if isinstance(value, (int, float, str)) else json_kind(value)
            return f"{key} is {shown}, not {kind}"
    return None


def _file_problem(path: Path) -> str | None:
    if path.suffix == ".safetensors":
        return _safetensors_problem(path)
    if path.suffix in (".pt", ".bin", ".pth"):
        return _torch_file_problem(path)
    if path.suffix == ".json":
        value, problem = read_json(path)
        if problem is None and path.name in JSON_OBJECTS and not isinstance(value, dict):
            problem = f"holds {json_kind(value)}, not an object"
        if problem is None and path.name == TRAINER_STATE:
            problem = trainer_state_problem(value)
        return problem
    return None


def _weights_problem(directory: Path) -> str | None:
    for index_name in WEIGHT_INDEXES:
        index = directory / index_name
        if index.is_file():
            data, problem = read_json(index)
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            if problem or not isinstance(weight_map, dict) or not all(
                    isinstance(shard, str) and "/" not in shard and shard not in ("", ".", "..")
                    for shard in weight_map.values()):
                return f"{index_name}: {problem or 'its weight_map is not a map of tensor names to shard files'}"
            missing = sorted(shard for shard in set(weight_map.values()) if not (directory / shard).is_file())
            return f"shards missing: {', '.join(missing)}" if missing else None
    if any((directory / name).is_file() for name in WEIGHT_FILES):
        return None
    if (directory / "latest").is_file() and any(directory.glob("global_step*")):
        return None  # DeepSpeed's own layout: model states live in global_step*/
    return "no model weights"


def _structure(path: Path) -> str | None:
    """The name of the cheap structural check a file's kind has (its header or directory only), or None."""
    if path.suffix == ".safetensors":
        return "safetensors header"
    if path.suffix in (".pt", ".bin", ".pth"):
        return "zip directory"
    return "json" if path.suffix == ".json" else None


def saved_files(directory: Path) -> tuple[dict[str, dict], str | None]:
    """What the info file records of a checkpoint just saved (relative path -> {size, checked}), and the first
    file that fails its cheap check (then the checkpoint is not marked complete).  Headers and directories only: a
    full hash of a 1 TB checkpoint would keep every other rank waiting in a collective for minutes."""
    records = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != CHECKPOINT_INFO:
            name = path.relative_to(directory).as_posix()
            record, why = file_record(path)
            if why:
                return records, f"{name}: {why}"
            records[name] = record
    return records, None


def file_record(path: Path) -> tuple[dict, str | None]:
    """What is recorded of one saved file without reading it through (its size and the cheap check it passed), and
    why it fails that check (None: it passes); checkpoints and the manifest of a folder of weights record this."""
    return {"size": path.stat().st_size, "checked": _structure(path)}, _file_problem(path)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def _every_byte_problem(path: Path, expected: dict) -> str | None:
    """``--verify``: the SHA-256 a checkpoint saved before tuner stopped hashing in the loop recorded, or else the
    checks that read every byte: each zip member against its CRC-32; a safetensors file read through (a read error
    shows, a flipped bit in tensor data cannot: the format stores no checksum)."""
    if "sha256" in expected:
        return None if file_sha256(path) == expected["sha256"] else "changed since it was saved (its SHA-256 differs)"
    if path.suffix in (".pt", ".bin", ".pth") and zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            return f"unreadable zip member ({exc})"
        return f"damaged (zip member {bad} fails its CRC-32)" if bad else None
    if path.suffix == ".safetensors":
        with open(path, "rb") as stream:
            while stream.read(READ_CHUNK):  # every byte: an I/O error is the damage
                pass
    return None


def _recorded_problem(directory: Path, verify: bool) -> str | None:
    """The first file that differs from what the info file recorded at save time (none recorded: nothing to
    check): missing or another size, and with ``verify`` the check of every byte (:func:`_every_byte_problem`)."""
    info = directory / CHECKPOINT_INFO
    if not info.is_file():
        return None
    data, problem = read_json(info)
    if problem:
        return f"{CHECKPOINT_INFO}: {problem}"
    recorded = (data.get("files") or {}) if isinstance(data, dict) else None  # older checkpoints recorded none
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict) or not isinstance(recorded, dict) or \
            not all(isinstance(entry, dict) for entry in recorded.values()):
        return f"{CHECKPOINT_INFO}: not the settings and file list tuner writes (damaged)"
    for name, expected in sorted(recorded.items()):
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{CHECKPOINT_INFO}: names a file outside the checkpoint ({name[:80]!r})"
        path = directory / name
        if not path.is_file():
            return f"{name}: missing"
        if path.stat().st_size != expected.get("size"):
            return f"{name}: {path.stat().st_size} bytes, saved as {expected.get('size')}"
        why = _every_byte_problem(path, expected) if verify else None
        if why:
            return f"{name}: {why}"
    return None


def checkpoint_problem(directory: str | Path, verify: bool = False) -> str | None:
    """None when the checkpoint is complete; otherwise the first thing wrong with it, naming the file.  Headers,
    directories, JSON and the sizes saved, in milliseconds; ``verify`` (``tuner run --resume --verify``) reads every
    byte too."""
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
        kind = special_kind(path) if path.exists() else None
        if kind not in (None, "a directory"):
            return f"{path.relative_to(directory)}: not a regular file ({kind})"
        if path.is_file():
            why = _file_problem(path)
            if why:
                return f"{path.relative_to(directory)}: {why}"
    return _recorded_problem(directory, verify)


def template_problem(text: str) -> str | None:
    """Why a chat template does not compile (jinja2's sandbox, as transformers renders it), or None."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment().parse(text)
    except TemplateSyntaxError as exc:
        return f"line {exc.lineno}: {exc.message}"
    except RecursionError:
        return "nested too deeply"
    return None


def _settings_problem(directory: Path) -> str | None:
    """What the files a model folder is configured by say wrong: a config without a model type, an adapter tuner
    did not train (not LoRA, no positive rank), a chat template that does not compile."""
    config, _ = read_json(directory / "config.json") if (directory / "config.json").is_file() else ({}, None)
    if isinstance(config, dict) and "model_type" in config and not isinstance(config["model_type"], str):
        return "config.json: model_type is not text"
    if (directory / "adapter_config.json").is_file():
        adapter, _ = read_json(directory / "adapter_config.json")
        if adapter.get("peft_type") != ADAPTER_KIND:
            return (f"adapter_config.json: peft_type is {adapter.get('peft_type')!r:.40}, not {ADAPTER_KIND!r} (tuner "
                    "loads LoRA adapters)")
        rank = adapter.get("r")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            return f"adapter_config.json: r is {rank!r:.40}, not a positive rank"
    templates = []
    if (directory / CHAT_TEMPLATE_FILE).is_file():
        try:
            templates.append((CHAT_TEMPLATE_FILE, read_limited(directory / CHAT_TEMPLATE_FILE, MAX_JSON_BYTES,
                                                               pipes=False).decode("utf-8")))
        except (OSError, TooLarge, UnicodeDecodeError) as exc:
            return f"{CHAT_TEMPLATE_FILE}: unreadable ({exc})"
    if (directory / "tokenizer_config.json").is_file():
        settings, _ = read_json(directory / "tokenizer_config.json")
        if isinstance(settings.get("chat_template"), str):
            templates.append(("tokenizer_config.json: chat_template", settings["chat_template"]))
    for where, text in templates:
        problem = template_problem(text)
        if problem:
            return f"{where}: the chat template does not compile ({problem})"
    return None


def saved_model_problem(directory: str | Path) -> str | None:
    """None when a saved model, adapter or tokenizer folder looks whole; otherwise the first thing wrong with it,
    naming the file: not a plain file, JSON cut short or of the wrong shape, a safetensors header that does not
    tile its data, a weight index naming missing shards, or settings that cannot load (see ``_settings_problem``)."""
    directory = Path(directory)
    for path in sorted(directory.iterdir()):
        kind = special_kind(path) if path.exists() else "a broken link"
        if kind == "a directory":
            continue
        if kind is not None:
            return f"{path.name}: not a regular file ({kind})"
        why = _file_problem(path)
        if why:
            return f"{path.name}: {why}"
    if any(path.suffix == ".safetensors" or path.name in WEIGHT_INDEXES for path in directory.iterdir()):
        problem = _weights_problem(directory)
        if problem:
            return problem
    return _settings_problem(directory)
