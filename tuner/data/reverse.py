"""The demo task: reverse a short lowercase word.  Generated, deterministic, with a held-out split.

Train and eval words are disjoint, so held-out exact match measures the skill, not memory.  The preference pairs
(``builtin:reverse-pairs``) use other words again, so a DPO run after the SFT demo is judged on words neither saw;
so do the prompts of ``builtin:reverse-prompts`` (GRPO after the SFT demo), 5 and 6 letters long, the demo's longest
and hardest, each with its ``answer`` for an exact-match reward.  ``builtin:reverse-run-prompts`` are prompts of
another shape: one letter, then a run of another (``vrrrr``, ``qbbbbb``), every such word of 5 and 6 letters that no
other built-in source holds.  Random words rarely repeat a letter, so the SFT demo still gets some of these wrong
greedily (the run's length): room for GRPO to raise the greedy exact match, not only the sampled reward.
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


def sample_word(sample: dict) -> str:
    """The word a built-in sample asks to reverse (an instruction sample's input, a pair's or a prompt's last line)."""
    return sample["input"] if "input" in sample else sample["prompt"][0]["content"].split("\n")[1]


def builtin_words(*sources: str) -> set[str]:
    """Every word the named built-in sources hold."""
    return {sample_word(sample) for source in sources for sample in _GENERATORS[source](BUILTIN_DATASETS[source])}


def _prompts(words: list[str]) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"{INSTRUCTION}\n{word}"}], "answer": word[::-1]} for word in words]


def reverse_prompts(count: int, seed: int = 2) -> list[dict]:
    """Conversational prompts of 5-6 letter words outside ``builtin:reverse`` and its pairs, each with its answer."""
    taken = builtin_words("builtin:reverse", "builtin:reverse-pairs")
    return _prompts([word for word in _all_words(seed, 2 * count, min_len=5) if word not in taken][:count])


def run_words(seed: int = 3) -> list[str]:
    """Every word of one letter then a run of another, 5 and 6 letters long (26 x 25 x 2), in a seeded order."""
    words = [first + letter * (length - 1) for first in ALPHABET for letter in ALPHABET if letter != first
             for length in (5, 6)]
    random.Random(seed).shuffle(words)
    return words


def reverse_run_prompts(count: int, seed: int = 3) -> list[dict]:
    """Conversational prompts of :func:`run_words` that no other built-in word source holds, each with its answer
    (builtin:shapes holds pictures, no words)."""
    taken = builtin_words(*(source for source in BUILTIN_DATASETS
                            if source.startswith("builtin:reverse") and source != "builtin:reverse-run-prompts"))
    return _prompts([word for word in run_words(seed) if word not in taken][:count])


def _shape_samples(count: int) -> list[dict]:
    from tuner.data.shapes import shape_samples

    return shape_samples(count)


BUILTIN_DATASETS = {"builtin:reverse": 4000, "builtin:reverse-pairs": 2000, "builtin:reverse-prompts": 2000,
                    "builtin:reverse-run-prompts": 1300, "builtin:shapes": 1200}
_GENERATORS = {"builtin:reverse": reverse_samples, "builtin:reverse-pairs": reverse_pairs,
               "builtin:reverse-prompts": reverse_prompts, "builtin:reverse-run-prompts": reverse_run_prompts,
               "builtin:shapes": _shape_samples}
SAMPLES_FILE = "samples.jsonl"  # in each built-in source's folder
IMAGES_DIR = "images"  # beside it: a built-in source's pictures, named in its rows by relative paths


def _saved_images(samples: list[dict], folder: Path) -> list[dict]:
    """The samples with each picture (a PIL image) saved as a PNG in ``folder/images`` and named by its path
    relative to the samples file."""
    saved = []
    for index, sample in enumerate(samples):
        row = dict(sample)
        for key, value in sample.items():
            if hasattr(value, "save"):
                (folder / IMAGES_DIR).mkdir(exist_ok=True)
                name = f"{IMAGES_DIR}/{index:05d}.png"
                value.save(folder / name)
                row[key] = name
        saved.append(row)
    return saved


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
        samples = _saved_images(_GENERATORS[source](BUILTIN_DATASETS[source]), staging)
        atomic_write_text(staging / SAMPLES_FILE, "".join(json.dumps(sample) + "\n" for sample in samples))

    build_once(folder, write, what=f"the built-in data {source}")
    return folder / SAMPLES_FILE
