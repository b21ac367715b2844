"""What the model will be trained on: formatted, tokenised examples split into learned and masked text.

``tuner data preview`` prints these; the TUI shows the same segments.  A preference row (dpo, kto) shows one
example per answer: the prompt masked, the answer learned, as TRL tokenises them.  A grpo prompt shows what the
model is given to complete (nothing of it is learned: the completions are sampled) and its reward inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.data.formats import IGNORE_INDEX, TRUNCATED
from tuner.recipe.schema import Recipe


@dataclass
class PreviewExample:
    segments: list[tuple[str, bool]]  # (text, trainable): consecutive tokens with the same loss flag, decoded
    tokens: int
    trainable_tokens: int
    truncated: bool
    answer: str | None = None  # preference rows: chosen, rejected, desirable or undesirable
    row: int | None = None  # preference rows: the sample this answer belongs to (1 = the first)
    reward_inputs: dict | None = None  # grpo prompts: the columns the rewards read beside each completion


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


def preview_examples(recipe: Recipe, tokenizer, count: int = 3, processor=None) -> tuple[str, list[PreviewExample]]:
    """The data format and the first ``count`` training samples as the Trainer will see them: taken from the
    prepared dataset when a run (or a preview before) prepared it, so the file is neither read nor tokenised again;
    otherwise the first samples of the split (of a stream: the first it yields, read no further), encoded here.
    Image-text rows are made by the model's ``processor`` (refused without one), as training's collator makes them."""
    from tuner.data.images import is_image_format
    from tuner.data.prepare import encode_batch, first_rows, split_samples
    from tuner.data.prepared import is_prepared, load_prepared, prepared_folder

    folder = None if recipe.objective.kind != "sft" else prepared_folder(recipe, tokenizer)
    if is_prepared(folder):
        prepared = load_prepared(folder, flags=True)
        data_format, encoded = prepared.data_format, prepared.train[:count]
    else:
        train, _, data_format = split_samples(recipe)
        rows = first_rows(train, count)
        if recipe.objective.preference or recipe.objective.kind == "reward":  # pairs: each answer after its prompt
            return data_format, [example for row, sample in enumerate(rows, 1)
                                 for example in preference_examples(sample, data_format, tokenizer, recipe, row)]
        if recipe.objective.kind == "grpo":
            return data_format, [prompt_example(sample, tokenizer, recipe) for sample in rows]
        if is_image_format(data_format):
            return data_format, [image_example(sample, data_format, processor, recipe) for sample in rows]
        encoded = encode_batch({key: [row[key] for row in rows] for key in rows[0]}, data_format, tokenizer, recipe)
    return data_format, [
        PreviewExample(segments=labelled_segments(input_ids, labels, tokenizer), tokens=len(labels),
                       trainable_tokens=sum(label != IGNORE_INDEX for label in labels), truncated=truncated)
        for input_ids, labels, truncated in zip(encoded["input_ids"], encoded["labels"], encoded[TRUNCATED])]


def preference_examples(sample: dict, data_format: str, tokenizer, recipe: Recipe, row: int) -> list[PreviewExample]:
    """One example per answer of a preference row: its prompt masked, the answer learned, cut to max_seq_length."""
    from tuner.data.preference import COMPLETION_KEYS, encode_completions

    prompt_ids, completions = encode_completions(sample, data_format, tokenizer)
    keys = COMPLETION_KEYS[data_format]
    names = list(keys) if data_format == "preference" else ["desirable" if sample["label"] else "undesirable"]
    limit = recipe.training.max_seq_length
    examples = []
    for name, ids in zip(names, completions):
        labels = ([IGNORE_INDEX] * len(prompt_ids) + ids)[:limit]
        input_ids = (prompt_ids + ids)[:limit]
        examples.append(PreviewExample(
            segments=labelled_segments(input_ids, labels, tokenizer), tokens=len(input_ids),
            trainable_tokens=sum(label != IGNORE_INDEX for label in labels),
            truncated=len(prompt_ids) + len(ids) > limit, answer=name, row=row))
    return examples


def prompt_example(sample: dict, tokenizer, recipe: Recipe) -> PreviewExample:
    """A grpo prompt as generation starts from it, with its reward inputs; ``truncated`` when it is longer than
    max_prompt_length (training drops it)."""
    from tuner.data.prompts import prompt_ids, prompt_text, reward_inputs

    tokens = len(prompt_ids(sample["prompt"], tokenizer))
    return PreviewExample(segments=[(prompt_text(sample["prompt"], tokenizer), False)], tokens=tokens,
                          trainable_tokens=0, truncated=tokens > recipe.objective.grpo.max_prompt_length,
                          reward_inputs=reward_inputs(sample))


def image_example(sample: dict, data_format: str, processor, recipe: Recipe) -> PreviewExample:
    """An image-text row as training's collator makes it (the processor's tokens, the image tokens among the
    masked ones), labelled with each image's size in pixels."""
    from tuner.data.images import conversation, data_folder, image_collator
    from tuner.data.sources import DataError

    if processor is None:
        raise DataError(f"data.format: {data_format} is image-text data, and {recipe.model.id} has no image "
                        "processor; train it with an image-text model (one transformers builds with "
                        "AutoModelForImageTextToText), or use text data.")
    images = conversation(sample, data_format, data_folder(recipe.data.source), recipe.data.max_image_pixels)[2]
    batch = image_collator(recipe, processor, data_format)([sample])
    input_ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    sizes = ", ".join(f"{image.width}x{image.height}" for image in images)
    return PreviewExample(segments=labelled_segments(input_ids, labels, processor.tokenizer), tokens=len(input_ids),
                          trainable_tokens=sum(label != IGNORE_INDEX for label in labels),
                          truncated=len(input_ids) >= recipe.training.max_seq_length,
                          answer=f"image {sizes}" if len(images) == 1 else f"images {sizes}")
