"""``tuner validate RECIPE``: check a recipe and print it fully resolved."""
from __future__ import annotations

from tuner.commands._recipe_args import add_recipe_arguments, recipe_from_args


def register(subparsers) -> None:
    parser = subparsers.add_parser("validate", help="check a recipe; print it with every default filled in")
    add_recipe_arguments(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing when the recipe is valid")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tuner.recipe.io import recipe_to_yaml

    recipe = recipe_from_args(args)
    if not args.quiet:
        print(recipe_to_yaml(recipe), end="")
    return 0
