"""The recipe argument and ``--set`` overrides, shared by every command that takes a recipe."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.recipe.schema import Recipe


def add_recipe_arguments(parser: argparse.ArgumentParser, required: bool = True,
                         help: str = "recipe YAML file, or the name of a built-in recipe (tuner recipes ls)") -> None:
    parser.add_argument("recipe", nargs=None if required else "?", help=help)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field, e.g. --set training.micro_batch_size=4 (repeatable)")


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    """The checked recipe; its warnings (e.g. trust_remote_code) go to stderr, so every command shows them."""
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import resolve_recipe_argument

    recipe = load_recipe(resolve_recipe_argument(args.recipe), args.overrides)
    say_warnings(recipe)
    return recipe


def say_warnings(recipe: Recipe) -> None:
    """The recipe's warnings on stderr, before anything of the recipe's (a model's code, a reward) can run."""
    from tuner.recipe.warnings import recipe_warnings

    for warning in recipe_warnings(recipe):
        print(f"warning: {warning}", file=sys.stderr)
