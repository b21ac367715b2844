"""The demo task: reverse a short lowercase word.  Generated, deterministic, with a held-out split.

Train and eval words are disjoint, so held-out exact match measures the skill, not memory.
"""
from __future__ import annotations

import json
import random
import string
from pathlib import Path

from tuner.fileio import atomic_write_text

INSTRUCTION = "reverse"
ALPHABET = string.ascii_lowercase


def _all_words(seed: int, count: int, min_len: int = 3, max_len: int = 6) -> list[str]:
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < count:
        length = rng.randint(min_len, max_len)
        words.add("".join(rng.choice(ALPHABET) for _ in range(length)))
    ordered = sorted(words)
    rng.shuffle(ordered)
    return ordered


def reverse_samples(count: int, seed: int = 0) -> list[dict[str, str]]:
    """Instruction-format samples: {'instruction': 'reverse', 'input': word, 'output': drow}."""
    return [{"instruction": INSTRUCTION, "input": word, "output": word[::-1]} for word in _all_words(seed, count)]


BUILTIN_DATASETS = {"builtin:reverse": 4000}


def builtin_dataset_path(source: str, directory: Path) -> Path:
    """Write the samples of a built-in data source as JSONL under ``directory`` (once) and return the file.

    Every word is distinct, so any split of the file keeps held-out words unseen in training.
    """
    if source not in BUILTIN_DATASETS:
        raise ValueError(f"unknown built-in data source {source!r}; known: {', '.join(BUILTIN_DATASETS)}")
    path = directory / f"{source.removeprefix('builtin:')}.jsonl"
    if not path.exists():
        atomic_write_text(path, "".join(json.dumps(sample) + "\n" for sample in reverse_samples(BUILTIN_DATASETS[source])))
    return path
