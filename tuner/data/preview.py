"""What the model will be trained on: formatted, tokenised examples split into learned and masked text.

``tuner data preview`` prints these; the TUI shows the same segments.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.data.formats import IGNORE_INDEX
from tuner.recipe.schema import Recipe


@dataclass
class PreviewExample:
    segments: list[tuple[str, bool]]  # (text, trainable): consecutive tokens with the same loss flag, decoded
    tokens: int
    trainable_tokens: int
    truncated: bool


def labelled_segments(input_ids: list[int], labels: list[int], tokenizer) -> list[tuple[str, bool]]:
    """Decode runs of tokens that share a loss flag: [(text, trainable), ...] in order.

    Pure apart from the tokenizer's decode: the TUI can call it for any tokenised sample.
    """
    segments: list[tuple[str, bool]] = []
    run: list[int] = []
    flag = None
    for token, label in zip(input_ids, labels):
        trainable = label != IGNORE_INDEX
        if run and trainable != flag:
            segments.append((tokenizer.decode(run), flag))
            run = []
        run.append(token)
        flag = trainable
    if run:
        segments.append((tokenizer.decode(run), flag))
    return segments


def preview_examples(recipe: Recipe, tokenizer, count: int = 3) -> tuple[str, list[PreviewExample]]:
    """The data format and the first ``count`` training samples as the Trainer will see them."""
    from tuner.data.prepare import encode_sample, split_samples

    train, _, data_format = split_samples(recipe)
    examples = []
    for sample in train.select(range(min(count, len(train)))):
        encoded = encode_sample(sample, data_format, tokenizer, recipe)
        labels = encoded["labels"]
        examples.append(PreviewExample(
            segments=labelled_segments(encoded["input_ids"], labels, tokenizer),
            tokens=len(labels),
            trainable_tokens=sum(label != IGNORE_INDEX for label in labels),
            truncated=encoded["truncated"],
        ))
    return data_format, examples
