"""Turn a recipe's data section into tokenised, loss-masked train and eval datasets.

Every problem a user can fix in the data (bad rows, missing columns, nothing left after
truncation or masking) is raised as a DataError here, before the model is built or trained.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from tuner.build_once import BuildTimeout, build_once
from tuner.data.formats import (
    FORMAT_COLUMNS,
    IGNORE_INDEX,
    TRUNCATED,
    detect_format,
    problem_rows,
    sample_problem,
    sample_segments,
    text_segments,
    tokenize_batch,
)
from tuner.data import sources
from tuner.data.images import IMAGE_COLUMNS, MAX_IMAGE_PIXELS, data_folder, image_row_problem, is_image_format
from tuner.data.preference import PREFERENCE_COLUMNS, preference_problem
from tuner.data.prompts import PROMPT_COLUMNS, prompt_problem
from tuner.data.sources import DataError, Samples, load_split
from tuner.home import tuner_home
from tuner.recipe.objective_checks import OBJECTIVE_FORMATS
from tuner.recipe.schema import STREAM_SHUFFLE_BUFFER, Recipe

log = logging.getLogger("tuner")


@dataclass
class PreparedData:
    train: object  # datasets.Dataset with input_ids / labels (a datasets.IterableDataset when streamed)
    eval: object | None
    data_format: str
    truncated: int | None  # training samples cut to max_seq_length (None when streamed: not known up front)
    dropped: int | None  # training samples left with no token to learn from (None when streamed)
    raw_eval: object | None  # untokenised held-out samples, for generation checks


# every data.format, the columns it needs
LAYOUT_COLUMNS = {**FORMAT_COLUMNS, **PREFERENCE_COLUMNS, **PROMPT_COLUMNS, **IMAGE_COLUMNS}
# the layouts whose rows are checked one by one in Python (the others by Arrow column checks first); an image
# layout's check also opens each image, relative to the data file (check_samples)
ROW_CHECKS = {**{layout: preference_problem for layout in PREFERENCE_COLUMNS},
              **{layout: prompt_problem for layout in PROMPT_COLUMNS},
              **{layout: image_row_problem for layout in IMAGE_COLUMNS}}


def resolve_format(requested: str, columns: list[str], objective: str = "sft") -> str:
    """The layout to read the samples in: the recipe's, checked against the columns, or detected from them."""
    if requested == "auto" and len(OBJECTIVE_FORMATS[objective]) > 1:  # sft, distill: the columns tell
        try:
            detected = detect_format(columns)
            if detected not in OBJECTIVE_FORMATS[objective]:
                raise ValueError(f"objective {objective} reads {' or '.join(OBJECTIVE_FORMATS[objective])} data, but "
                                 f"the columns {sorted(columns)} are {detected} data")
            return detected
        except ValueError as exc:
            hint = next((f" They look like {layout} data: set objective.kind: {kind}."
                         for kind, layouts in OBJECTIVE_FORMATS.items() for layout in layouts
                         if layout in ROW_CHECKS and LAYOUT_COLUMNS[layout] <= set(columns)), "")
            raise DataError(f"data.format: {exc}{hint}") from None
    field = "data.format"
    if requested == "auto":  # dpo, kto and grpo read one layout each
        requested, field = OBJECTIVE_FORMATS[objective][0], "objective.kind"
    missing = LAYOUT_COLUMNS[requested] - set(columns)
    if missing:
        raise DataError(f"{field}: {requested} needs the column(s) {sorted(missing)}, but the data has {sorted(columns)}; "
                        "rename the columns, or set data.format to match the data (or auto).")
    return requested


def row_bytes(column):
    """UTF-8 bytes of the text in each row of an Arrow column (nested lists and messages included), as a numpy array."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return pc.fill_null(pc.binary_length(column), 0).to_numpy().astype(np.int64)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        inner = row_bytes(pc.list_flatten(column))
        return np.bincount(pc.list_parent_indices(column).to_numpy(), weights=inner, minlength=len(column)).astype(np.int64)
    if pa.types.is_struct(column.type):
        return sum((row_bytes(column.field(i)) for i in range(column.type.num_fields)), np.zeros(len(column), np.int64))
    return np.zeros(len(column), np.int64)


def used_columns(data_format: str, columns: list[str]) -> list[str]:
    """The columns a layout reads (optional ones included when present)."""
    optional = {"prompt"} if data_format in PREFERENCE_COLUMNS else {"images"} if data_format == "image_chat" else {"input"}
    return sorted((LAYOUT_COLUMNS[data_format] | optional) & set(columns))


def streamed(dataset) -> bool:
    """Whether ``dataset`` is a stream (a datasets.IterableDataset: no length, read as it is iterated)."""
    return not hasattr(dataset, "__len__")


def empty(dataset) -> bool:
    """Whether the dataset, or the stream, has no row (told without decoding one: datasets cannot decode some
    nested shapes, which the row checks name)."""
    if not streamed(dataset):
        return len(dataset) == 0
    return next(iter(dataset.with_format("arrow").iter(batch_size=1)), None) is None


def first_rows(dataset, count: int) -> list[dict]:
    """The first ``count`` rows of a dataset, or of a stream (read no further than they are)."""
    return list(dataset.take(count) if streamed(dataset) else dataset.select(range(min(count, len(dataset)))))


def column_batches(dataset, columns: list[str]):
    """``columns`` of the dataset as Arrow record batches of at most _CHECK_BATCH rows, in the dataset's order:
    from the table in memory, or read from a stream one batch at a time."""
    dataset = dataset.select_columns(columns)
    if not streamed(dataset):
        yield from dataset.data.table.to_batches(max_chunksize=_CHECK_BATCH)
        return
    for table in dataset.with_format("arrow").iter(batch_size=_CHECK_BATCH):
        yield from table.to_batches()


def check_samples(samples: Samples, data_format: str, max_pixels: int = MAX_IMAGE_PIXELS) -> int:
    """Refuse the data when any row does not fit the layout or is larger than a row may be, naming the first rows by
    their file lines (row numbers for parquet and hub datasets); returns the number of rows.  The checks run on
    Arrow columns a record batch at a time, in memory or streamed alike; only the rows they flag (all preference
    and prompt rows, whose checks stay in Python) are read as rows, a batch at a time."""
    import numpy as np
    from datasets import Features

    dataset = samples.dataset
    used = used_columns(data_format, columns_of(dataset))
    problem_of = ROW_CHECKS.get(data_format, sample_problem)
    if is_image_format(data_format):
        base = data_folder(samples.source)
        problem_of = lambda sample, layout: image_row_problem(sample, layout, base, max_pixels)  # noqa: E731
    problems = samples.problems()
    features = dataset.features and Features({name: dataset.features[name] for name in used})
    offset = 0
    try:
        for batch in column_batches(dataset, used):
            mask = None if data_format in ROW_CHECKS else problem_rows(batch, data_format)
            bad = np.ones(batch.num_rows, bool) if mask is None else mask.to_numpy(zero_copy_only=False).copy()
            size = sum((row_bytes(column) for column in batch.columns), np.zeros(batch.num_rows, np.int64))
            flagged = np.flatnonzero(bad | (size > sources.MAX_ROW_BYTES))
            rows = batch.take(flagged).to_pylist()  # as datasets decodes them: e.g. a Json column holds JSON text
            for index, sample in zip(flagged.tolist(), map(features.decode_example, rows) if features else rows):
                large = size[index] > sources.MAX_ROW_BYTES
                problem = problem_of(sample, data_format) or (sources.too_large(int(size[index])) if large else None)
                if problem:
                    problems.add_row(offset + index, problem)
            offset += batch.num_rows
    except (KeyError, TypeError, ValueError) as exc:  # datasets cannot decode some nested shapes, e.g. {"\x00": {}}
        raise DataError(f"data.source: {samples.source}: the samples cannot be read ({exc!r}); the column(s) "
                        f"{', '.join(used)} should hold text (for chat, a list of role/content messages).") from None
    problems.raise_any(offset, f"Fix or remove those rows, or set data.format (they are read as {data_format}).")
    return offset


_CHECK_BATCH = 10_000


def columns_of(dataset) -> list[str]:
    """The dataset's column names; a stream whose loader does not know them up front (CSV) is read for its first
    row."""
    if dataset.column_names is not None:
        return dataset.column_names
    return next(iter(dataset.with_format("arrow").iter(batch_size=1))).column_names


def load_samples(recipe: Recipe, scan: bool = True) -> tuple[Samples, str]:
    """The recipe's samples (streamed when the recipe says so) and the format they are read in; a local file is
    scanned row by row first (unless ``scan`` is false), holding one row at a time."""
    samples = load_split(recipe.data.source, recipe.data.split, recipe.data.streaming, scan)
    if empty(samples.dataset):
        raise DataError(f"data.source: {recipe.data.source}: the dataset is empty.")
    columns = columns_of(samples.dataset)
    data_format = resolve_format(recipe.data.format, columns, recipe.objective.kind)
    if recipe.objective.grpo is not None:
        _check_reward_columns(recipe, columns)
    return samples, data_format


def _check_reward_columns(recipe: Recipe, columns: list[str]) -> None:
    """Every column a grpo reward reads is a column of the data."""
    for index, reward in enumerate(recipe.objective.grpo.rewards):
        if reward.column is not None and reward.column not in columns:
            raise DataError(f"objective.grpo.rewards.{index}.column: {reward.kind} reads the column "
                            f"{reward.column!r}, which {recipe.data.source} lacks (its columns: "
                            f"{', '.join(sorted(columns))}); name one of them, or add it to the data.")


def split_samples(recipe: Recipe):
    """The raw samples, checked, shuffled with the seed and split into (train, eval or None), plus the format.

    A stream is shuffled within a buffer of STREAM_SHUFFLE_BUFFER samples, cut to max_samples and not split (the
    recipe checks refuse eval_fraction); its rows are not checked here: :func:`check_data` reads the whole stream
    for that before ``tuner run`` launches, and reading it again would cost every rank what training costs.

    A local file's rows are checked once (:func:`checked_samples`): ``tuner run`` checks it before launch, and the
    ranks, a re-run, a resume and preview then only load it."""
    if recipe.data.streaming:
        samples, data_format = load_samples(recipe, scan=False)
        dataset = samples.dataset.shuffle(seed=recipe.training.seed, buffer_size=STREAM_SHUFFLE_BUFFER)
        return (dataset.take(recipe.data.max_samples) if recipe.data.max_samples else dataset), None, data_format
    samples, data_format = checked_samples(recipe)
    dataset = samples.dataset
    if recipe.objective.kind == "grpo":  # a reward's failure names its prompt by the row it came from
        from tuner.data.prompts import ROW_COLUMN

        dataset = dataset.add_column(ROW_COLUMN, list(range(1, len(dataset) + 1)))
    dataset = dataset.shuffle(seed=recipe.training.seed)
    if recipe.data.max_samples:
        dataset = dataset.select(range(min(recipe.data.max_samples, len(dataset))))
    if recipe.data.eval_fraction == 0:
        return dataset, None, data_format
    n_eval = max(1, int(round(len(dataset) * recipe.data.eval_fraction)))
    if n_eval >= len(dataset):
        raise DataError(f"data.eval_fraction: {len(dataset)} samples leave none for training; lower eval_fraction.")
    return dataset.select(range(n_eval, len(dataset))), dataset.select(range(n_eval)), data_format


@dataclass(frozen=True)
class DataSummary:
    train: int
    held_out: int
    data_format: str
    streamed: bool = False  # read and tokenised as training goes


def check_data(recipe: Recipe) -> DataSummary:
    """Every check of the data that needs no tokenizer: the file is readable row by row (UTF-8, JSON/CSV shape,
    row sizes, nesting), the columns fit the format, every row fits it, and the split leaves samples to train on.

    Raises DataError naming the file and line.  ``tuner run`` calls it before it writes or launches anything;
    preview and the training entrypoint run the same checks (:func:`split_samples`).  A stream is read through
    once for them, a batch at a time: memory does not grow with the data.
    """
    if not recipe.data.streaming:
        train, held_out, data_format = split_samples(recipe)
        return DataSummary(len(train), len(held_out) if held_out is not None else 0, data_format)
    samples, data_format = load_samples(recipe)
    rows = check_samples(samples, data_format)
    return DataSummary(min(rows, recipe.data.max_samples or rows), 0, data_format, streamed=True)


def encode_batch(batch: dict[str, list], data_format: str, tokenizer, recipe: Recipe) -> dict[str, list]:
    """A batch of samples (datasets' batched ``map``: column -> values) as input_ids, labels (-100 where no loss is
    taken), whether each was truncated and whether it still has a token to learn from."""
    if data_format == "text":  # no row to assemble
        return tokenize_batch(text_segments(batch["text"], tokenizer), tokenizer, recipe.training.max_seq_length,
                              recipe.data.train_on_prompt)
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    try:
        segments = [sample_segments(row, data_format, tokenizer) for row in rows]
    except ValueError as exc:
        raise DataError(f"data.format: {exc}") from None
    return tokenize_batch(segments, tokenizer, recipe.training.max_seq_length, recipe.data.train_on_prompt)


SAMPLES_PER_PROCESS = 20_000  # on fewer samples a tokenising process costs more to start than it saves


def tokenising_processes(recipe: Recipe, samples: int) -> int | None:
    """datasets' ``num_proc`` for tokenising ``samples``: the recipe's, or one per core this rank may use (the
    machine's cores shared by its ranks), at most one per SAMPLES_PER_PROCESS; None for one process."""
    import os

    if recipe.data.num_proc:
        return recipe.data.num_proc if recipe.data.num_proc > 1 else None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # Linux/other
    cores = usable // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    processes = min(cores, samples // SAMPLES_PER_PROCESS)
    return processes if processes > 1 else None


def tokenise(raw, recipe: Recipe, tokenizer, data_format: str, what: str):
    """(dataset, truncated count, dropped count): samples with nothing left to learn from are dropped; each kept
    sample has input_ids, labels and its TRUNCATED flag."""
    import pyarrow.compute as pc

    max_length = recipe.training.max_seq_length
    encoded = raw.map(encode_batch, batched=True, fn_kwargs=dict(data_format=data_format, tokenizer=tokenizer,
                                                                  recipe=recipe),
                      remove_columns=raw.column_names, desc=f"tokenising {what}", load_from_cache_file=False,
                      num_proc=tokenising_processes(recipe, len(raw)))
    total = len(encoded)
    truncated = pc.sum(encoded.data.column(TRUNCATED)).as_py() or 0
    if truncated == total:
        raise DataError(f"training.max_seq_length: all {total} {what} samples are longer than {max_length} tokens; "
                        "raise max_seq_length (the planner shows what it costs) or shorten the samples.")
    learns = encoded.data.column("learns")
    kept = pc.sum(learns).as_py() or 0
    if not kept:
        raise DataError(f"data: none of the {total} {what} samples has a token to learn from after loss masking and "
                        f"truncation to {max_length} tokens; check the format, raise max_seq_length, "
                        "or set data.train_on_prompt: true.")
    dropped = total - kept
    if truncated:
        log.warning("%d of %d %s samples were longer than max_seq_length=%d and were truncated",
                    truncated, total, what, max_length)
    if dropped:
        log.warning("%d of %d %s samples had no token to learn from after masking/truncation and were dropped",
                    dropped, total, what)
        encoded = encoded.select(pc.indices_nonzero(learns).to_numpy().astype("int64"))
    return encoded.remove_columns(["learns"]), truncated, dropped


def tokenise_stream(raw, recipe: Recipe, tokenizer, data_format: str):
    """A stream of samples tokenised as it is read, with :func:`encode_batch` as :func:`tokenise` does, the samples
    with nothing to learn from dropped; how many were truncated or dropped is not known up front."""
    used = used_columns(data_format, columns_of(raw))
    encoded = raw.select_columns(used).map(encode_batch, batched=True, remove_columns=used, fn_kwargs=dict(
        data_format=data_format, tokenizer=tokenizer, recipe=recipe))
    return encoded.filter(lambda batch: batch["learns"], batched=True).remove_columns([TRUNCATED, "learns"])


# What the checks and the prepared dataset depend on besides the recipe and the tokenizer: tuner's code that reads,
# checks, formats and tokenises the samples.
_PREPARING_CODE = tuple(Path(__file__).with_name(name) for name in ("prepare.py", "prepared.py", "formats.py",
                                                                     "sources.py", "preference.py", "prompts.py"))


def data_key(recipe: Recipe, **fields) -> str | None:
    """A key for what was made of the recipe's data file: the file (resolved path, size, modification time), the
    given fields and tuner's preparing code; None for a hub dataset or a stream (nothing is kept for those)."""
    import hashlib
    import json

    loader, argument = sources.resolve_source(recipe.data.source)
    if loader == "hub" or recipe.data.streaming:
        return None
    path = Path(argument).resolve()
    stat = path.stat()
    keyed = {"file": [str(path), stat.st_size, stat.st_mtime_ns], **fields,
             "code": [hashlib.sha256(code.read_bytes()).hexdigest() for code in _PREPARING_CODE]}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:32]


CHECKED_DIR = "checked"  # under $TUNER_HOME: one folder per data file whose every row passed the checks


def checked_marker(recipe: Recipe) -> Path | None:
    """Where the proof is kept that every row of the recipe's data file passed the checks, read as the recipe reads
    it (source, split, format, objective): a cache folder holding only its completion marker; None for a hub dataset
    or a stream, checked every time."""
    key = data_key(recipe, read_as=[recipe.data.source, recipe.data.split, recipe.data.format,
                                     recipe.objective.kind, recipe.data.max_image_pixels])
    return tuner_home() / CHECKED_DIR / key if key else None


def checked_samples(recipe: Recipe) -> tuple[Samples, str]:
    """The recipe's samples (not streamed) and their format, every row checked, by this process or before: a local
    file whose rows all passed (the same file, read the same way, by the same checks: :func:`checked_marker`) is
    loaded without a scan, and of the processes that ask at once one checks it while the others wait for the proof."""
    def check() -> tuple[Samples, str]:
        samples, data_format = load_samples(recipe)
        check_samples(samples, data_format, recipe.data.max_image_pixels)
        return samples, data_format

    marker = checked_marker(recipe)
    if marker is None:
        return check()
    checked = cache_or_make(marker, check, lambda made, staging: None, what=f"the row checks of {recipe.data.source}")
    if checked is not None:
        return checked
    log.info("data: every row of %s passed the checks before (same file, read the same way); not scanned again",
             recipe.data.source)
    return load_samples(recipe, scan=False)


T = TypeVar("T")


def cache_or_make(folder: Path, make: Callable[[], T], save: Callable[[T, Path], None], what: str) -> T | None:
    """What ``make`` returns, saved by ``save(made, staging)`` as the cache ``folder`` (:func:`build_once`), or None
    when the cache was complete already (or another process completed it meanwhile).  A home that cannot hold the
    cache (read-only, full) costs only the cache: what was made is returned, and the next run makes it again."""
    made: list[T] = []

    def build(staging: Path) -> T:
        made.append(make())
        save(made[0], staging)
        return made[0]

    try:
        return build_once(folder, build, what=what)
    except BuildTimeout:
        raise
    except OSError as exc:
        log.info("data: %s was not cached in %s (%s)", what, folder, exc)
        return made[0] if made else make()


def tokenised_data(recipe: Recipe, tokenizer) -> PreparedData:
    """The recipe's samples checked, split and tokenised, each with its TRUNCATED flag (a stream: tokenised as it is
    read, without flags)."""
    train_raw, eval_raw, data_format = split_samples(recipe)
    if is_image_format(data_format):  # the collator reads the images and tokenises as training goes (ImageCollator)
        log.info("data: %d training and %d held-out %s samples (images read per batch)", len(train_raw),
                 len(eval_raw) if eval_raw else 0, data_format)
        return PreparedData(train_raw, eval_raw, data_format, None, None, eval_raw)
    if streamed(train_raw):
        log.info("data: streaming %s samples: read and tokenised as training goes, shuffled within %d (their rows "
                 "were checked before launch)", data_format, STREAM_SHUFFLE_BUFFER)
        return PreparedData(tokenise_stream(train_raw, recipe, tokenizer, data_format), None, data_format, None,
                            None, None)
    log.info("data: %d training and %d held-out %s samples", len(train_raw), len(eval_raw) if eval_raw else 0, data_format)
    train, truncated, dropped = tokenise(train_raw, recipe, tokenizer, data_format, "training")
    evaluation = tokenise(eval_raw, recipe, tokenizer, data_format, "held-out")[0] if eval_raw is not None else None
    return PreparedData(train, evaluation, data_format, truncated, dropped, eval_raw)


def data_collator(recipe: Recipe, tokenizer):
    """Pad each micro-batch, or with packing concatenate it into one row without padding.

    Packing uses transformers' DataCollatorWithFlattening: position_ids restart at every sample and the
    model's mask keeps attention within each sample (the model must run with use_cache=False).
    """
    from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening

    if recipe.data.packing:
        return DataCollatorWithFlattening()
    return DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=IGNORE_INDEX)
