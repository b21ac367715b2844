"""``tuner doctor [RECIPE]``: check this machine before a run; non-zero exit when the recipe's needs are not met.

With a multi-machine recipe it adds the multi-machine preflight (tuner/preflight.py); ``--preflight`` runs only
that, as ``launch.sh N`` does on each machine before its rendezvous, and then downloads the run's hub model into
this machine's cache when any of it is missing."""
from __future__ import annotations

import sys
from pathlib import Path

from tuner.commands._recipe_args import add_recipe_arguments, recipe_from_args
from tuner.commands._types import at_least

EXIT_CHECK_FAILED = 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check torch, GPUs, kernels, DeepSpeed ops, disk and RAM; with a recipe, against its needs")
    add_recipe_arguments(parser, required=False)
    parser.add_argument("--json", action="store_true", help="print the checks as JSON lines")
    parser.add_argument("--machine-rank", type=at_least(0), default=None, metavar="N",
                        help="on a multi-machine recipe: this machine's rank (checks the rank and the route to rank 0)")
    parser.add_argument("--preflight", action="store_true",
                        help="only the multi-machine checks, then the run's hub model into this machine's cache "
                             "(what launch.sh runs on each machine before it starts)")
    parser.set_defaults(run=run)


def run(args) -> int:
    import json

    from tuner.doctor import run_checks
    from tuner.preflight import fetch_run_model, machine_checks

    recipe = recipe_from_args(args) if args.recipe else None
    if args.preflight and (recipe is None or recipe.hardware.machines == 1):
        print("error: --preflight checks a multi-machine recipe: give one with hardware.machines above 1",
              file=sys.stderr)
        return 2
    results = [] if args.preflight else run_checks(recipe)
    if recipe is not None:
        results += machine_checks(recipe, args.machine_rank)
    if args.preflight and not any(result.status == "fail" for result in results):
        model_files = fetch_run_model(Path(args.recipe).parent)  # launch.sh passes the run's lock file
        results += [model_files] if model_files else []
    for result in results:
        print(json.dumps(result.__dict__) if args.json else result.line())
    failed = [result.name for result in results if result.status == "fail"]
    if not args.json:
        against = (f" for {args.recipe}" if recipe else "") + (
            f" on machine {args.machine_rank}" if recipe and args.machine_rank is not None else "")
        print(f"\n{len(failed)} check(s) failed{against}: {', '.join(failed)}" if failed else
              f"\nall required checks passed{against}")
    return EXIT_CHECK_FAILED if failed else 0
