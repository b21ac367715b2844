"""The built-in demo: train the demo model on word reversal through the real launch path,
and measure held-out exact match before and after."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.recipe.schema import Recipe


@dataclass
class ExactMatch:
    accuracy: float
    examples: list[tuple[str, str, str]]  # (input, expected, answer)


def held_out_samples(recipe: Recipe) -> list[dict]:
    """The evaluation split the training run holds out (same seed, same split)."""
    from tuner.train.dataset import split_samples

    _, held_out, _ = split_samples(recipe)
    return list(held_out)


def exact_match(recipe: Recipe, model_path: str | Path, samples: list[dict], shown: int = 5) -> ExactMatch:
    """Greedy answers of the model at ``model_path`` compared with the expected outputs."""
    from tuner.data.formats import prompt_text
    from tuner.infer.generate import generate_answers
    from tuner.loading.model import load_model, load_tokenizer

    tokenizer = load_tokenizer(recipe, str(model_path))
    model = load_model(recipe, str(model_path))
    prompts = [prompt_text(sample, "instruction", tokenizer) for sample in samples]
    longest = max(len(tokenizer(sample["output"], add_special_tokens=False)["input_ids"]) for sample in samples)
    answers = generate_answers(model, tokenizer, prompts, max_new_tokens=longest + 1)
    results = [(s["input"], s["output"], a.strip()) for s, a in zip(samples, answers)]
    correct = sum(expected == answer for _, expected, answer in results)
    return ExactMatch(correct / len(results), results[:shown])
