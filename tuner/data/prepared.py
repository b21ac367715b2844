"""The prepared (tokenised) dataset, kept under ``$TUNER_HOME/prepared/<fingerprint>``: made once by whichever
process asks first (:func:`tuner.data.prepare.cache_or_make`), loaded by the ranks, re-runs and resumes after it.

The fingerprint is the data file, the recipe fields that shape its samples and tokens, the tokenizer and tuner's
preparing code (:func:`tuner.data.prepare.data_key`); a stream, a hub dataset or image data is never kept.
"""
from __future__ import annotations

import logging
from pathlib import Path

from tuner.build_once import is_built
from tuner.data.formats import TRUNCATED
from tuner.data.images import is_image_format
from tuner.data.prepare import PreparedData, cache_or_make, data_key, streamed, tokenised_data
from tuner.home import tuner_home
from tuner.recipe.schema import Recipe

log = logging.getLogger("tuner")


def data_fingerprint(recipe: Recipe, tokenizer) -> str | None:
    """A key for the prepared dataset: the data file, the recipe fields that shape the samples and their tokens,
    the tokenizer and tuner's preparing code; None for a hub dataset or a stream (not cached)."""
    from datasets.fingerprint import Hasher

    return data_key(recipe, data=recipe.data.model_dump(mode="json", exclude={"num_proc"}),  # same tokens in any
                     max_seq_length=recipe.training.max_seq_length, seed=recipe.training.seed,  # number of processes
                     objective=recipe.objective.kind, tokenizer=Hasher.hash(tokenizer))


def prepared_folder(recipe: Recipe, tokenizer) -> Path | None:
    """``$TUNER_HOME/prepared/<fingerprint>``: where the recipe's prepared dataset is (or will be) kept."""
    fingerprint = data_fingerprint(recipe, tokenizer)
    return tuner_home() / PREPARED_DIR / fingerprint if fingerprint else None


def prepare_data(recipe: Recipe, tokenizer) -> PreparedData:
    """The tokenised train and held-out datasets; reused from ``$TUNER_HOME/prepared/<fingerprint>`` when the same
    data file was prepared the same way before (a re-run, a resume, another rank or machine), and saved there
    otherwise: of the processes that prepare it at once, one tokenises while the others wait to load it."""
    folder = prepared_folder(recipe, tokenizer)
    if folder is None or is_image_format(recipe.data.format):  # a stream, a hub dataset, images: nothing is kept
        prepared = tokenised_data(recipe, tokenizer)
        return prepared if streamed(prepared.train) or is_image_format(prepared.data_format) else without_flags(prepared)
    prepared = cache_or_make(folder, lambda: tokenised_data(recipe, tokenizer), save_prepared,
                             what="the prepared dataset")
    if prepared is None:
        log.info("data: reusing the prepared dataset in %s (same data file, recipe fields and tokenizer)", folder)
        return load_prepared(folder)
    return without_flags(prepared)


PREPARED_DIR = "prepared"  # under $TUNER_HOME, one folder per fingerprint
PREPARED_INFO = "prepared.json"  # the format and the truncated and dropped counts


def is_prepared(folder: Path | None) -> bool:
    return folder is not None and is_built(folder)


def without_flags(prepared: PreparedData) -> PreparedData:
    """The prepared datasets as the Trainer takes them: input_ids and labels only."""
    from dataclasses import replace

    return replace(prepared, train=prepared.train.remove_columns([TRUNCATED]),
                   eval=prepared.eval.remove_columns([TRUNCATED]) if prepared.eval is not None else None)
_PREPARED_SPLITS = ("train", "eval", "raw_eval")


def save_prepared(prepared: PreparedData, folder: Path) -> None:
    """Write the prepared datasets into ``folder``: the hidden staging folder of :func:`cache_or_make`, published
    whole, so ranks that prepare at once, or a run stopped halfway, never leave a partial folder to be reused."""
    import json

    from tuner.fileio import atomic_write_text

    for name in _PREPARED_SPLITS:
        dataset = getattr(prepared, name)
        if dataset is not None:
            dataset.save_to_disk(str(folder / name))  # in the order its indices give (no extra copy)
    info = {"data_format": prepared.data_format, "truncated": prepared.truncated, "dropped": prepared.dropped}
    atomic_write_text(folder / PREPARED_INFO, json.dumps(info) + "\n")


def load_prepared(folder: Path, flags: bool = False) -> PreparedData:
    """The prepared datasets kept in ``folder``; with ``flags``, each sample's TRUNCATED flag too (for preview)."""
    import json

    from datasets import load_from_disk

    info = json.loads((folder / PREPARED_INFO).read_text())
    splits = {name: load_from_disk(str(folder / name)) if (folder / name).is_dir() else None
              for name in _PREPARED_SPLITS}
    prepared = PreparedData(splits["train"], splits["eval"], info["data_format"], info["truncated"], info["dropped"],
                            splits["raw_eval"])
    return prepared if flags else without_flags(prepared)
