"""``tuner doctor [RECIPE]``: check this machine before a run; non-zero exit when the recipe's needs are not met."""
from __future__ import annotations

from tuner.commands._recipe_args import add_recipe_arguments, recipe_from_args

EXIT_CHECK_FAILED = 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check torch, GPUs, kernels, DeepSpeed ops, disk and RAM; with a recipe, against its needs")
    add_recipe_arguments(parser, required=False)
    parser.add_argument("--json", action="store_true", help="print the checks as JSON lines")
    parser.set_defaults(run=run)


def run(args) -> int:
    import json

    from tuner.doctor import run_checks

    recipe = recipe_from_args(args) if args.recipe else None
    results = run_checks(recipe)
    for result in results:
        print(json.dumps(result.__dict__) if args.json else result.line())
    failed = [result.name for result in results if result.status == "fail"]
    if not args.json:
        against = f" for {args.recipe}" if recipe else ""
        print(f"\n{len(failed)} check(s) failed{against}: {', '.join(failed)}" if failed else
              f"\nall required checks passed{against}")
    return EXIT_CHECK_FAILED if failed else 0
