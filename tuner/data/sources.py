"""Load samples from a recipe's data source: local files, the datasets cache, or a built-in task."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tuner.data.reverse import BUILTIN_DATASETS, builtin_dataset_path
from tuner.home import tuner_home

FILE_LOADERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class DataError(Exception):
    """The data cannot be used; the message says what to fix."""


def resolve_source(source: str) -> tuple[str, str]:
    """Return (datasets loader, argument): ('json', path), ('parquet', path) or ('hub', name)."""
    if source in BUILTIN_DATASETS:
        return "json", str(builtin_dataset_path(source, tuner_home() / "data"))
    path = Path(source).expanduser()
    if path.suffix.lower() in FILE_LOADERS:
        if not path.is_file():
            raise DataError(f"data.source: {source}: no such file.")
        return FILE_LOADERS[path.suffix.lower()], str(path)
    if path.exists():
        raise DataError(f"data.source: {source}: use a .json, .jsonl, .csv or .parquet file.")
    return "hub", source


MAX_LISTED = 5  # problem rows named in one message


@dataclass
class Samples:
    """A loaded split and, for JSON-lines files, the file line of every row (for messages)."""

    dataset: object  # datasets.Dataset
    lines: list[int] | None = None

    def where(self, row: int) -> str:
        return f"line {self.lines[row]}" if self.lines else f"row {row + 1}"


def listed(places: list[str]) -> str:
    """'line 3, line 9, ... (and 12 more)': the first few places of a problem."""
    more = f" (and {len(places) - MAX_LISTED} more)" if len(places) > MAX_LISTED else ""
    return ", ".join(places[:MAX_LISTED]) + more


def json_lines_rows(path: Path) -> list[int] | None:
    """Line numbers of the objects in a JSON-lines file (None for a JSON array file).

    datasets' own parser reports a malformed line as a pyarrow error without its number;
    this pass names every bad line before anything is loaded.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"data.source: {path}:{exc.lineno}: not valid JSON ({exc.msg}).") from None
        if not all(isinstance(row, dict) for row in rows):
            raise DataError(f"data.source: {path}: a JSON array of objects (one per sample) is expected.")
        return None
    lines, bad, empty = [], [], 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.append(f"line {number} ({exc.msg})")
            continue
        if not isinstance(value, dict):
            bad.append(f"line {number} (a JSON {type(value).__name__}, not an object)")
            continue
        lines.append(number)
        empty += not value
    if bad:
        raise DataError(f"data.source: {path}: {len(bad)} of {len(bad) + len(lines)} lines are not JSON objects: "
                        f"{listed(bad)}. Fix or remove them (one JSON object per line).")
    if lines and empty == len(lines):  # datasets would find no columns and say so in its own words
        raise DataError(f"data.source: {path}: the file holds no samples: every line is an empty object {{}}.")
    return lines


def load_split(source: str, split: str) -> Samples:
    """The named split of a data source, after checking that a local JSON file parses."""
    import datasets

    loader, argument = resolve_source(source)
    try:
        if loader == "hub":
            return Samples(datasets.load_dataset(argument, split=split))
        lines = json_lines_rows(Path(argument)) if loader == "json" else None
        if lines == []:
            raise DataError(f"data.source: {source}: the file holds no samples.")
        return Samples(datasets.load_dataset(loader, data_files={split: argument}, split=split), lines)
    except (FileNotFoundError, ConnectionError, ValueError) as exc:
        if loader == "hub":
            raise DataError(
                f"data.source: cannot load dataset {source!r} (split {split!r}): {exc}. Offline, only datasets already "
                "in the local cache load; otherwise point data.source at a local .jsonl/.csv/.parquet file."
            ) from None
        raise DataError(f"data.source: {source}: {exc}") from None
