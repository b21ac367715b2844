"""``tuner demo``: build the demo model, train it through ``accelerate launch``, show what it learned.

A demo that starts from another built-in recipe's result (``demo-dpo``, ``demo-grpo``: ``model.id: runs/demo/final``)
trains that recipe first when its result is not there yet, in ``<run dir>/sft``, then itself in ``<run dir>/dpo`` (or
``grpo``): one command.
"""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tuner.commands.run import launch_and_report, prepare_or_refuse

if TYPE_CHECKING:
    from tuner.recipe.schema import Recipe


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="train the built-in tiny model on word reversal, end to end on this machine")
    parser.add_argument("--recipe", default="demo", help="built-in recipe or file to run (default: demo)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("-o", "--output", help="run directory (default: runs/demo-<time>)")
    parser.set_defaults(run=run)


class ExactMatch(NamedTuple):
    accuracy: float
    examples: list[tuple[str, str, str]]  # (input, expected, answer)


def held_out_samples(recipe: Recipe) -> list[dict]:
    """The evaluation split the training run holds out (same seed, same split)."""
    from tuner.data.prepare import split_samples

    _, held_out, _ = split_samples(recipe)
    return list(held_out)


def _question_and_answer(sample: dict, tokenizer, recipe: Recipe) -> tuple[str, str, str]:
    """(word shown, prompt text, expected answer) of a held-out reversal: an instruction sample, a pair, or a prompt
    with the column its exact-match reward reads."""
    if recipe.objective.kind == "grpo":
        from tuner.data.prompts import prompt_text as grpo_prompt

        column = next(reward.column for reward in recipe.objective.grpo.rewards if reward.kind == "exact_match")
        prompt = sample["prompt"]
        shown = prompt[-1]["content"] if isinstance(prompt, list) else prompt
        return shown.split("\n")[-1], grpo_prompt(prompt, tokenizer), str(sample[column])
    if "chosen" in sample:
        from tuner.data.preference import prompt_and_chosen

        prompt, expected = prompt_and_chosen(sample, tokenizer)
        return sample["prompt"][-1]["content"].split("\n")[-1], prompt, expected
    from tuner.data.formats import prompt_text

    return sample["input"], prompt_text(sample, "instruction", tokenizer), sample["output"]


def exact_match(recipe: Recipe, model_path: str | Path, samples: list[dict], shown: int = 5) -> ExactMatch:
    """Greedy answers of the model at ``model_path`` compared with the expected outputs."""
    from tuner.infer.generate import generate_answers
    from tuner.loading.model import load_model, load_tokenizer

    tokenizer = load_tokenizer(recipe, str(model_path))
    model = load_model(recipe, str(model_path))
    questions = [_question_and_answer(sample, tokenizer, recipe) for sample in samples]
    longest = max(len(tokenizer(expected, add_special_tokens=False)["input_ids"]) for _, _, expected in questions)
    answers = generate_answers(model, tokenizer, [prompt for _, prompt, _ in questions], max_new_tokens=longest + 1)
    results = [(word, expected, answer.strip()) for (word, _, expected), answer in zip(questions, answers)]
    correct = sum(expected == answer for _, expected, answer in results)
    return ExactMatch(correct / len(results), results[:shown])


def _print_examples(title: str, result) -> None:
    print(f"{title}: held-out exact match {result.accuracy:.1%}")
    for word, expected, answer in result.examples:
        mark = "ok " if answer == expected else "   "
        print(f"  {mark} reverse {word!r:10} -> {answer!r:12} (expected {expected!r})")


def _reward_lines(run_dir: Path) -> list[str]:
    """The held-out reward metrics of a dpo/kto/grpo run, first evaluation (before training) to last."""
    from tuner.events import read_events
    from tuner.recipe.io import load_recipe
    from tuner.run_layout import EVENTS_FILE, LOCK_FILE

    recipe = load_recipe(run_dir / LOCK_FILE)
    key = "eval_reward" if recipe.objective.kind == "grpo" else "eval_rewards/margins"
    evals = [e for e in read_events(run_dir / EVENTS_FILE) if e.get(key) is not None]
    if len(evals) < 2:
        return []
    first, last = evals[0], evals[-1]

    def change(key: str, percent: bool = False) -> str:
        return " -> ".join(f"{e[key]:.1%}" if percent else f"{e[key]:.3f}" for e in (first, last))

    if recipe.objective.kind == "grpo":
        grpo = recipe.objective.grpo
        return [f"held-out mean reward {change('eval_reward')} (steps {first['step']} -> {last['step']}; "
                f"{grpo.num_generations} completions per prompt sampled at temperature {grpo.temperature:g}, as in "
                "training)"]

    return [f"held-out reward accuracy {change('eval_rewards/accuracies', True)}, reward margin "
            f"{change('eval_rewards/margins')} (steps {first['step']} -> {last['step']}; the rewards are 0 before "
            "training, when the model is its own reference)",
            f"held-out log-probability of the chosen answers {change('eval_logps/chosen')}, of the rejected ones "
            f"{change('eval_logps/rejected')}"]


def run(args) -> int:
    from tuner.loading.model import resolve_model_path
    from tuner.recipe.io import load_recipe, with_model_id
    from tuner.recipe.registry import builtin_path, starting_recipe
    from tuner.run_layout import FINAL_DIR

    start = time.monotonic()
    path = Path(args.recipe) if Path(args.recipe).exists() else builtin_path(args.recipe)
    recipe = load_recipe(path, args.overrides)
    run_dir = Path(args.output or f"runs/demo-{datetime.now():%Y%m%d-%H%M%S}")
    first = starting_recipe(recipe)
    if first is not None:  # check both phases before the slow part; the second starts from the first's result
        first_prepared = prepare_or_refuse(first, output_dir=run_dir / "sft")
        recipe = with_model_id(recipe, run_dir / "sft" / FINAL_DIR)
        run_dir = run_dir / recipe.objective.kind
        print(f"demo: {first.name} ({first.objective.kind}) in {first_prepared.run_dir}, then {recipe.name} "
              f"({recipe.objective.kind}) from its result in {run_dir}")
        prepared = None
    else:
        prepared = prepare_or_refuse(recipe, output_dir=run_dir)  # every check before the slow part
    samples = held_out_samples(recipe)
    if first is not None:
        print(f"demo model: {resolve_model_path(first.model.id)}")
        print(f"training {first.name} in {first_prepared.run_dir} ...")
        outcome = launch_and_report(first_prepared)
        if outcome.exit_code != 0:
            return outcome.exit_code
        prepared = prepare_or_refuse(recipe, output_dir=run_dir)
    else:
        print(f"demo model: {resolve_model_path(recipe.model.id)}")
    before = exact_match(recipe, resolve_model_path(recipe.model.id), samples)
    _print_examples("before training", before)
    print(f"training in {run_dir} ...")
    outcome = launch_and_report(prepared)
    if outcome.exit_code != 0:
        return outcome.exit_code
    after = exact_match(recipe, run_dir / FINAL_DIR, samples)
    _print_examples("after training", after)
    for line in _reward_lines(run_dir):
        print(line)
    print(f"demo finished in {time.monotonic() - start:.0f} s: exact match {before.accuracy:.1%} -> {after.accuracy:.1%}")
    return 0
