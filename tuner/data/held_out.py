"""The samples a run held out, as questions with their expected answers: what ``tuner eval`` scores, the demo
prints, and ``tuner export`` checks its file on.  The split is the training run's own (same seed, same
fraction: :func:`tuner.data.prepare.split_samples`), so none of these samples was trained on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tuner.data.sources import DataError
from tuner.recipe.schema import Recipe


@dataclass(frozen=True)
class HeldOut:
    """One held-out sample: the prompt as the model is given it, the expected answer (the chosen one for a
    preference pair, the column an exact or regex match reward reads for a grpo prompt, None for text), the rejected
    answer of a pair, the sample's input shown to people, and a grpo prompt's reward inputs (its other columns)."""

    prompt: str
    expected: str | None
    rejected: str | None = None
    shown: str = ""
    reward_inputs: dict = field(default_factory=dict)


def held_out_samples(recipe: Recipe) -> tuple[list[dict], str]:
    """The raw held-out samples and their format; DataError when the recipe holds none out."""
    from tuner.data.prepare import split_samples

    if recipe.data.eval_fraction == 0:
        raise DataError("data.eval_fraction is 0: the run held no samples out, so there is nothing unseen to evaluate "
                        "on. Name lm-eval tasks with --tasks, or train with a held-out fraction.")
    _, held_out, data_format = split_samples(recipe)
    return list(held_out), data_format


def as_question(sample: dict, data_format: str, tokenizer, recipe: Recipe | None = None) -> HeldOut:
    """A sample as the model is asked it (the chat template, as training rendered it) and what it should answer
    (``recipe``: a grpo recipe, whose rewards name the column of the expected answer)."""
    if data_format == "text":
        return HeldOut(prompt=sample["text"], expected=None, shown=sample["text"][:40])
    if data_format == "prompt":
        from tuner.data.prompts import prompt_text as rendered, reward_inputs

        rewards = recipe.objective.grpo.rewards if recipe is not None and recipe.objective.grpo else []
        column = next((r.column for r in rewards if r.kind in ("exact_match", "regex_match")), None)
        prompt = sample["prompt"]
        last = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        return HeldOut(rendered(prompt, tokenizer), None if column is None else str(sample[column]),
                       shown=last.split("\n")[-1], reward_inputs=reward_inputs(sample))
    if data_format in ("preference", "unpaired_preference"):
        from tuner.data.preference import prompt_and_chosen, with_prompt

        if data_format == "unpaired_preference":
            raise DataError("unpaired preference data (kto) has no pair to compare; evaluate it with --tasks.")
        prompt, chosen = prompt_and_chosen(sample, tokenizer)
        pair = with_prompt(sample)
        rejected = pair["rejected"] if isinstance(pair["rejected"], str) else \
            "".join(message["content"] for message in pair["rejected"])
        last = pair["prompt"] if isinstance(pair["prompt"], str) else pair["prompt"][-1]["content"]
        return HeldOut(prompt, chosen, rejected, shown=last.split("\n")[-1])
    from tuner.data.formats import prompt_text

    if data_format == "chat":
        answer = next(message["content"] for message in sample["messages"] if message["role"] == "assistant")
        user = next((message["content"] for message in sample["messages"] if message["role"] == "user"), "")
        return HeldOut(prompt_text(sample, "chat", tokenizer), answer, shown=user)
    return HeldOut(prompt_text(sample, "instruction", tokenizer), sample["output"],
                   shown=sample.get("input") or sample["instruction"])
