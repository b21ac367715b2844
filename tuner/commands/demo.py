"""``tuner demo``: build the demo model, train it through ``accelerate launch``, show what it learned."""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tuner.commands.run import launch_and_report, prepare_or_refuse
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_path
from tuner.recipe.schema import Recipe
from tuner.run_layout import FINAL_DIR


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="train the built-in tiny model on word reversal, end to end on this machine")
    parser.add_argument("--recipe", default="demo", help="built-in recipe or file to run (default: demo)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("-o", "--output", help="run directory (default: runs/demo-<time>)")
    parser.set_defaults(run=run)


@dataclass
class ExactMatch:
    accuracy: float
    examples: list[tuple[str, str, str]]  # (input, expected, answer)


def held_out_samples(recipe: Recipe) -> list[dict]:
    """The evaluation split the training run holds out (same seed, same split)."""
    from tuner.data.prepare import split_samples

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


def _print_examples(title: str, result) -> None:
    print(f"{title}: held-out exact match {result.accuracy:.1%}")
    for word, expected, answer in result.examples:
        mark = "ok " if answer == expected else "   "
        print(f"  {mark} reverse {word!r:10} -> {answer!r:12} (expected {expected!r})")


def run(args) -> int:
    from tuner.loading.model import resolve_model_path

    start = time.monotonic()
    path = Path(args.recipe) if Path(args.recipe).exists() else builtin_path(args.recipe)
    recipe = load_recipe(path, args.overrides)
    run_dir = Path(args.output or f"runs/demo-{datetime.now():%Y%m%d-%H%M%S}")
    prepared = prepare_or_refuse(recipe, output_dir=run_dir)  # every check before the slow part
    print(f"demo model: {resolve_model_path(recipe.model.id)}")
    samples = held_out_samples(recipe)
    before = exact_match(recipe, resolve_model_path(recipe.model.id), samples)
    _print_examples("before training", before)
    print(f"training in {run_dir} ...")
    outcome = launch_and_report(prepared)
    if outcome.exit_code != 0:
        return outcome.exit_code
    after = exact_match(recipe, run_dir / FINAL_DIR, samples)
    _print_examples("after training", after)
    print(f"demo finished in {time.monotonic() - start:.0f} s: exact match {before.accuracy:.1%} -> {after.accuracy:.1%}")
    return 0
