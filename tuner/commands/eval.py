"""``tuner eval RUN|RECIPE|--model ID [--tasks NAMES] [--baseline]``: score a model with lm-evaluation-harness on the
recipe's held-out samples and on named harness tasks; with ``--baseline`` the base model beside it in one table.
Results of a run go to RUN/eval/ and its trackers, and its summary shows the newest."""
from __future__ import annotations

import sys

from tuner.commands._recipe_args import add_recipe_arguments
from tuner.commands._types import at_least, memory_budget
from tuner.rundir.library_output import VERBOSE_HELP


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a run with lm-evaluation-harness: its held-out split and named tasks")
    add_recipe_arguments(parser, required=False,
                         help="tuner run directory (runs/<name>), recipe YAML file or built-in recipe name")
    parser.add_argument("--model", metavar="PATH_OR_ID", help="model directory or hub id (replaces the recipe's model.id)")
    parser.add_argument("--adapter", metavar="DIR", help="LoRA adapter folder or tuner run directory to apply")
    parser.add_argument("--tasks", metavar="NAMES", default="",
                        help="lm-evaluation-harness tasks, groups or tags, comma-separated (their data must be local "
                             "or reachable)")
    parser.add_argument("--include-path", metavar="DIR",
                        help="a folder of your own harness task YAMLs; a task naming Python code (!function) needs "
                             "--allow-task-code")
    parser.add_argument("--allow-task-code", action="store_true",
                        help="run the Python code --include-path's task files name (!function module.name): the "
                             "harness imports it, with your permissions, when it loads the task")
    parser.add_argument("--no-held-out", dest="held_out", action="store_false",
                        help="skip the task built from the recipe's held-out split")
    parser.add_argument("--baseline", action="store_true",
                        help="also evaluate the model training started from, and show both in one table")
    parser.add_argument("--limit", type=at_least(1), metavar="N", help="at most N held-out samples")
    parser.add_argument("--batch-size", type=at_least(1), default=16, metavar="N", help="samples per batch (default 16)")
    parser.add_argument("--max-memory", action="append", default=[], metavar="DEVICE=SIZE", type=memory_budget,
                        help="memory budget per device, as for tuner infer")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    parser.set_defaults(run=run)


def base_target(target):
    """What training started from: the recipe's model.id, without the run's adapter or weights."""
    from dataclasses import replace

    from tuner.loading.model import resolve_model_path

    base = resolve_model_path(target.recipe.model.id)
    return replace(target, model_path=base, tokenizer_path=base, adapter=None)


def announce_task_code(include_path: str, allowed: bool) -> None:
    """Name the Python code the task files would run, before anything loads them: refused (exit 2) unless
    ``--allow-task-code``, then a warning."""
    from tuner.data.sources import DataError
    from tuner.evaluate.tasks import task_code

    code = task_code(include_path)
    if not code:
        return
    shown = "; ".join(code[:5]) + (f"; and {len(code) - 5} more" if len(code) > 5 else "")
    if not allowed:
        raise DataError(f"--include-path {include_path}: task files name Python code, which lm-evaluation-harness "
                        f"imports and runs with your permissions when it loads the task ({shown}); review it, then "
                        "pass --allow-task-code to run it.")
    print(f"warning: --allow-task-code: lm-evaluation-harness will import and run the Python code these task files "
          f"name, with your permissions: {shown}", file=sys.stderr)


def run(args) -> int:
    from rich.console import Console

    from tuner.data.sources import DataError
    from tuner.evaluate.evaluation import evaluate
    from tuner.infer.target import resolve_target
    from tuner.rundir.library_output import libraries_to_log

    if args.recipe is None and args.model is None:
        raise DataError("give a run directory, a recipe or --model PATH_OR_ID to evaluate.")
    if args.include_path:
        announce_task_code(args.include_path, args.allow_task_code)
    target = resolve_target(args.recipe, args.overrides, args.model, args.adapter)
    names = [name.strip() for name in args.tasks.split(",") if name.strip()]
    if not names and not args.held_out:
        raise DataError("--no-held-out leaves nothing to evaluate: name lm-eval tasks with --tasks.")
    models = [("base", base_target(target))] if args.baseline else []
    models.append(("fine-tuned" if target.run_dir else "model", target))
    with libraries_to_log(target.run_dir, args.verbose):  # loading bars, lm-eval's request bars
        evaluation = evaluate(models, names, args.include_path, held_out=args.held_out, limit=args.limit,
                              batch_size=args.batch_size, max_memory=dict(args.max_memory) or None)
    console = Console()
    console.print(evaluation.table)
    for result in evaluation.results:
        for shown, expected, answer in result.examples:
            mark = "ok " if answer == expected.strip() else "   "
            console.print(f"  {result.label}: {mark} {shown!r} -> {answer!r} (expected {expected!r})", highlight=False)
    for line in evaluation.notes:
        print(line, file=sys.stderr)
    return 0
