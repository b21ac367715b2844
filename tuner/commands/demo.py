"""``tuner demo``: build the demo model, train it through ``accelerate launch``, show what it learned.

A demo that starts from another built-in recipe's result (``demo-dpo``, ``demo-grpo``: ``model.id: runs/demo/final``;
``demo-distill``: ``objective.teacher: runs/demo/final``) trains that recipe first when its result is not there yet, in
``<run dir>/sft``, then itself in ``<run dir>/dpo`` (or ``grpo``, ``distill``): one command.  A distill demo shows the
teacher's held-out score beside the student's.
"""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.commands.run import launch_and_report, prepare_or_refuse
from tuner.rundir.library_output import VERBOSE_HELP

if TYPE_CHECKING:
    from tuner.evaluate.harness import ModelResult


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="train the built-in tiny model on word reversal, end to end on this machine")
    parser.add_argument("--recipe", default="demo", help="built-in recipe or file to run (default: demo)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("-o", "--output", help="run directory (default: runs/demo-<time>)")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    parser.set_defaults(run=run)


PERCENT_METRICS = ("exact_match", "acc", "exact_match(", "regex_match(")  # shares of the held-out samples
# acc: the chosen answer likelier than the rejected one; reward: a grpo recipe's rewards on greedy answers
METRIC_NAMES = {"acc": "preference accuracy", "reward": "greedy reward"}


def held_out_score(label: str, target, log: Path, verbose: bool = False) -> ModelResult:
    """The model of ``target`` on the recipe's held-out task, through ``tuner eval``'s own path; what the libraries
    print meanwhile goes to ``log`` (the run's train.log) unless ``verbose``."""
    from tuner.evaluate.evaluation import score_model
    from tuner.rundir.library_output import output_to_log

    with output_to_log(log, shown=verbose):
        return score_model(label, target)


class Phases:
    """How long each phase of the demo took, printed at its end: where a slow demo's time went."""

    def __init__(self):
        self.start = self.mark = time.monotonic()
        self.seconds: dict[str, float] = {}  # a phase done twice (the checks of both recipes) adds up

    def done(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.mark
        self.mark = now

    def line(self) -> str:
        return "time: " + ", ".join(f"{phase} {seconds:.0f} s" for phase, seconds in self.seconds.items())


def _print_score(title: str, result: ModelResult) -> list[str]:
    """Print the held-out metrics and examples; returns each metric as shown, for the closing line."""
    from tuner.evaluate.tasks import HELD_OUT_TASK

    shown = [f"{METRIC_NAMES.get(metric, metric.replace('_', ' '))} "
             f"{f'{value:.1%}' if metric.startswith(PERCENT_METRICS) else f'{value:.3f}'}"
             for metric, value in result.scores[HELD_OUT_TASK].items()]
    print(f"{title}: held-out {', '.join(shown)}")
    for word, expected, answer in result.examples:
        mark = "ok " if answer == expected else "   "
        print(f"  {mark} {word!r:16} -> {answer!r:12} (expected {expected!r})")
    return shown


def _first_value(result: ModelResult) -> str:
    """The first held-out metric of ``result`` as the closing line shows it."""
    from tuner.evaluate.tasks import HELD_OUT_TASK

    value = next(iter(result.scores[HELD_OUT_TASK].values()))
    return f"{value:.1%}"


def _reward_lines(run_dir: Path) -> list[str]:
    """The held-out reward metrics of a dpo/kto/grpo run, first evaluation (before training) to last."""
    from tuner.recipe.io import load_recipe
    from tuner.rundir.events import read_events
    from tuner.rundir.layout import EVENTS_FILE, LOCK_FILE

    recipe = load_recipe(run_dir / LOCK_FILE)
    key = {"grpo": "eval_reward", "reward": "eval_accuracy"}.get(recipe.objective.kind, "eval_rewards/margins")
    evals = [e for e in read_events(run_dir / EVENTS_FILE) if e.get(key) is not None]
    if len(evals) < 2:
        return []
    first, last = evals[0], evals[-1]

    def change(key: str, percent: bool = False) -> str:
        return " -> ".join(f"{e.get(key):.1%}" if percent else f"{e.get(key):.3f}" for e in (first, last))

    if recipe.objective.kind == "reward":
        return [f"held-out pair accuracy {change('eval_accuracy', True)}, mean margin {change('eval_margin')} "
                f"(steps {first.step} -> {last.step}; pairs whose right reversal the reward model scores above the "
                "near miss)"]
    if recipe.objective.kind == "grpo":
        grpo = recipe.objective.grpo
        return [f"held-out mean reward {change('eval_reward')} (steps {first.step} -> {last.step}; "
                f"{grpo.num_generations} completions per prompt sampled at temperature {grpo.temperature:g}, as in "
                "training)"]

    return [f"held-out reward accuracy {change('eval_rewards/accuracies', True)}, reward margin "
            f"{change('eval_rewards/margins')} (steps {first.step} -> {last.step}; the rewards are 0 before "
            "training, when the model is its own reference)",
            f"held-out log-probability of the chosen answers {change('eval_logps/chosen')}, of the rejected ones "
            f"{change('eval_logps/rejected')}"]


def run(args) -> int:
    from tuner.data.held_out import held_out_samples
    from tuner.evaluate.evaluation import save_results
    from tuner.infer.target import InferenceTarget, resolve_target
    from tuner.loading.model import resolve_model_path
    from tuner.recipe.io import load_recipe, with_starting_model
    from tuner.recipe.registry import builtin_path, starting_recipe
    from tuner.rundir.layout import FINAL_DIR, LOG_FILE
    from tuner.rundir.library_output import output_to_log

    phases = Phases()
    path = Path(args.recipe) if Path(args.recipe).exists() else builtin_path(args.recipe)
    recipe = load_recipe(path, args.overrides)
    run_dir = Path(args.output or f"runs/demo-{datetime.now():%Y%m%d-%H%M%S}")
    first = starting_recipe(recipe)
    if first is not None:  # check both phases before the slow part; the second starts from the first's result
        first_prepared = prepare_or_refuse(first, output_dir=run_dir / "sft")
        recipe = with_starting_model(recipe, run_dir / "sft" / FINAL_DIR)
        run_dir = run_dir / recipe.objective.kind
        print(f"demo: {first.name} ({first.objective.kind}) in {first_prepared.run_dir}, then {recipe.name} "
              f"({recipe.objective.kind}) from its result in {run_dir}")
        prepared = None
    else:
        prepared = prepare_or_refuse(recipe, output_dir=run_dir)  # every check before the slow part
    # datasets' bars, the demo model's build (transformers' bars, DeepSpeed's accelerator guess): to the first log
    with output_to_log((first_prepared if first is not None else prepared).run_dir / LOG_FILE, shown=args.verbose):
        held_out_samples(recipe)  # refused here when it holds none out
        demo_model = resolve_model_path((first or recipe).model.id)
    print(f"demo model: {demo_model}")
    if first is not None:
        print(f"training {first.name} in {first_prepared.run_dir} ...")
        phases.done("checks")
        outcome = launch_and_report(first_prepared)
        if outcome.exit_code != 0:
            return outcome.exit_code
        phases.done(f"{first.objective.kind} training")
        prepared = prepare_or_refuse(recipe, output_dir=run_dir)
    phases.done("checks")
    log = run_dir / LOG_FILE
    if recipe.objective.kind == "reward":  # it scores, it does not answer: the trainer measures it on the pairs
        return _reward_model_demo(prepared, run_dir, phases)
    teacher = None
    if recipe.objective.kind == "distill":
        path = resolve_model_path(recipe.objective.teacher)
        teacher = held_out_score("teacher", InferenceTarget(recipe, path, path), log, args.verbose)
        _print_score(f"teacher ({recipe.objective.teacher})", teacher)
        phases.done("scoring the teacher")
    base = resolve_model_path(recipe.model.id)
    before = held_out_score("base", InferenceTarget(recipe, base, base), log, args.verbose)
    shown_before = _print_score("before training", before)
    phases.done("scoring before")
    print(f"training in {run_dir} ...")
    outcome = launch_and_report(prepared)
    if outcome.exit_code != 0:
        return outcome.exit_code
    phases.done(f"{recipe.objective.kind} training")
    trained = resolve_target(str(run_dir), show_download=False)
    after = held_out_score("fine-tuned", trained, log, args.verbose)
    shown_after = _print_score("after training", after)
    phases.done("scoring after")
    for line in _reward_lines(run_dir):
        print(line)
    with output_to_log(log, shown=args.verbose):  # the trackers' own lines (mlflow, wandb) too
        _, notes = save_results(trained, [before, after] + ([teacher] if teacher else []))
    for line in notes:
        print(line)
    phases.done("saving")
    print(phases.line())
    beside = f" (the teacher's {_first_value(teacher)})" if teacher else ""
    print(f"demo finished in {time.monotonic() - phases.start:.0f} s: {shown_before[0]} -> "
          f"{shown_after[0].split(' ')[-1]}{beside}; the libraries' own output is in {log}")
    return 0


def _reward_model_demo(prepared, run_dir: Path, phases: Phases) -> int:
    """Train a reward model and show its held-out pair accuracy before training and after (the trainer evaluates
    the held-out pairs at step 0 and at the end)."""
    print(f"training in {run_dir} ...")
    outcome = launch_and_report(prepared)
    if outcome.exit_code != 0:
        return outcome.exit_code
    phases.done("reward training")
    lines = _reward_lines(run_dir)
    for line in lines:
        print(line)
    shown = lines[0].split(",")[0] if lines else "no held-out evaluation"
    print(phases.line())
    print(f"demo finished in {time.monotonic() - phases.start:.0f} s: {shown}")
    return 0
