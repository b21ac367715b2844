"""Load samples from a recipe's data source: local files, the datasets cache, or a built-in task."""
from __future__ import annotations

from pathlib import Path

from tuner.builtin.model import tuner_home
from tuner.builtin.task import BUILTIN_DATASETS, builtin_dataset_path

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


def load_split(source: str, split: str):
    """The named split of a data source as a ``datasets.Dataset``."""
    import datasets

    loader, argument = resolve_source(source)
    try:
        if loader == "hub":
            return datasets.load_dataset(argument, split=split)
        return datasets.load_dataset(loader, data_files={split: argument}, split=split)
    except (FileNotFoundError, ConnectionError, ValueError) as exc:
        if loader == "hub":
            raise DataError(
                f"data.source: cannot load dataset {source!r} (split {split!r}): {exc}. Offline, only datasets already "
                "in the local cache load; otherwise point data.source at a local .jsonl/.csv/.parquet file."
            ) from None
        raise DataError(f"data.source: {source}: {exc}") from None
