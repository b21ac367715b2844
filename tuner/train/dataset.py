"""Turn a recipe's data section into tokenised, loss-masked train and eval datasets."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from tuner.data.formats import detect_format, sample_segments, tokenize_segments
from tuner.data.sources import DataError, load_split
from tuner.recipe.schema import Recipe

log = logging.getLogger("tuner")


@dataclass
class PreparedData:
    train: object  # datasets.Dataset with input_ids / labels
    eval: object | None
    data_format: str
    truncated: int
    raw_eval: object | None  # untokenised held-out samples, for generation checks


def split_samples(recipe: Recipe):
    """The raw samples, shuffled with the seed and split into (train, eval or None), plus the format."""
    dataset = load_split(recipe.data.source, recipe.data.split)
    if len(dataset) == 0:
        raise DataError(f"data.source: {recipe.data.source}: the dataset is empty.")
    data_format = recipe.data.format
    if data_format == "auto":
        try:
            data_format = detect_format(dataset.column_names)
        except ValueError as exc:
            raise DataError(f"data.format: {exc}") from None
    dataset = dataset.shuffle(seed=recipe.training.seed)
    if recipe.data.max_samples:
        dataset = dataset.select(range(min(recipe.data.max_samples, len(dataset))))
    if recipe.data.eval_fraction == 0:
        return dataset, None, data_format
    n_eval = max(1, int(round(len(dataset) * recipe.data.eval_fraction)))
    if n_eval >= len(dataset):
        raise DataError(f"data.eval_fraction: {len(dataset)} samples leave none for training; lower eval_fraction.")
    return dataset.select(range(n_eval, len(dataset))), dataset.select(range(n_eval)), data_format


def prepare_data(recipe: Recipe, tokenizer) -> PreparedData:
    train_raw, eval_raw, data_format = split_samples(recipe)
    max_length = recipe.memory.max_seq_length

    def encode(sample):
        segments = sample_segments(sample, data_format, tokenizer)
        return tokenize_segments(segments, tokenizer, max_length, recipe.data.train_on_prompt)

    columns = train_raw.column_names
    train = train_raw.map(encode, remove_columns=columns, desc="tokenising")
    truncated = sum(train["truncated"])
    if truncated:
        log.warning("%d of %d training samples were longer than max_seq_length=%d and were truncated",
                    truncated, len(train), max_length)
    train = train.remove_columns("truncated")
    evaluation = None
    if eval_raw is not None:
        evaluation = eval_raw.map(encode, remove_columns=columns, desc="tokenising eval").remove_columns("truncated")
    return PreparedData(train, evaluation, data_format, truncated, eval_raw)
