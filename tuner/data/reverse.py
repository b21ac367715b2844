"""The demo task: reverse a short lowercase word.  Generated, deterministic, with a held-out split.

Train and eval words are disjoint, so held-out exact match measures the skill, not memory.  The preference pairs
(``builtin:reverse-pairs``) use other words again, so a DPO run after the SFT demo is judged on words neither saw;
so do the prompts of ``builtin:reverse-prompts`` (GRPO after the SFT demo), 5 and 6 letters long, the demo's longest
and hardest, each with its ``answer`` for an exact-match reward.
"""
from __future__ import annotations

import json
import random
import string
from pathlib import Path

from tuner.build_once import build_once
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


def near_miss(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: two neighbouring letters swapped, a letter repeated over its neighbour, or a letter
    dropped (the mistakes a half-trained model makes)."""
    swaps = [i for i in range(len(answer) - 1) if answer[i] != answer[i + 1]]
    candidates = []
    if swaps:
        i = rng.choice(swaps)
        candidates.append(answer[:i] + answer[i + 1] + answer[i] + answer[i + 2:])
        candidates.append(answer[:i + 1] + answer[i] + answer[i + 2:])  # a letter repeated in place of the next
    i = rng.randrange(len(answer))
    candidates.append(answer[:i] + answer[i + 1:])
    return rng.choice(candidates)


def reverse_pairs(count: int, seed: int = 1) -> list[dict]:
    """Conversational preference pairs on words outside ``builtin:reverse``: the reversal chosen, a near miss rejected."""
    taken = set(_all_words(0, BUILTIN_DATASETS["builtin:reverse"]))
    words = [word for word in _all_words(seed, 2 * count) if word not in taken][:count]
    rng = random.Random(seed)
    return [{"prompt": [{"role": "user", "content": f"{INSTRUCTION}\n{word}"}],
             "chosen": [{"role": "assistant", "content": word[::-1]}],
             "rejected": [{"role": "assistant", "content": near_miss(word[::-1], rng)}]} for word in words]


def reverse_prompts(count: int, seed: int = 2) -> list[dict]:
    """Conversational prompts of 5-6 letter words outside ``builtin:reverse`` and its pairs, each with its answer."""
    taken = set(_all_words(0, BUILTIN_DATASETS["builtin:reverse"]))
    taken |= {pair["prompt"][0]["content"].split("\n")[1] for pair in reverse_pairs(BUILTIN_DATASETS["builtin:reverse-pairs"])}
    words = [word for word in _all_words(seed, 2 * count, min_len=5) if word not in taken][:count]
    return [{"prompt": [{"role": "user", "content": f"{INSTRUCTION}\n{word}"}], "answer": word[::-1]} for word in words]


BUILTIN_DATASETS = {"builtin:reverse": 4000, "builtin:reverse-pairs": 2000, "builtin:reverse-prompts": 2000}
_GENERATORS = {"builtin:reverse": reverse_samples, "builtin:reverse-pairs": reverse_pairs,
               "builtin:reverse-prompts": reverse_prompts}
SAMPLES_FILE = "samples.jsonl"  # in each built-in source's folder


def builtin_dataset_path(source: str, directory: Path) -> Path:
    """The samples of a built-in data source as a JSONL file in its folder under ``directory``, written once by one
    of the processes that ask for it at once (the file's modification time is part of the data's key: never rewrite
    it).

    Every word is distinct, so any split of the file keeps held-out words unseen in training.
    """
    if source not in BUILTIN_DATASETS:
        raise ValueError(f"unknown built-in data source {source!r}; known: {', '.join(BUILTIN_DATASETS)}")
    folder = directory / source.removeprefix("builtin:")

    def write(staging: Path) -> None:
        samples = _GENERATORS[source](BUILTIN_DATASETS[source])
        atomic_write_text(staging / SAMPLES_FILE, "".join(json.dumps(sample) + "\n" for sample in samples))

    build_once(folder, write, what=f"the built-in data {source}")
    return folder / SAMPLES_FILE
