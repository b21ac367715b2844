"""The recipe argument and ``--set`` overrides, shared by every command that takes a recipe."""
from __future__ import annotations

import argparse

from tuner.recipe.io import load_recipe
from tuner.recipe.registry import resolve_recipe_argument
from tuner.recipe.schema import Recipe


def add_recipe_arguments(parser: argparse.ArgumentParser, required: bool = True,
                         help: str = "recipe YAML file, or the name of a built-in recipe (tuner recipes ls)") -> None:
    parser.add_argument("recipe", nargs=None if required else "?", help=help)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field, e.g. --set memory.micro_batch_size=4 (repeatable)")


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    return load_recipe(resolve_recipe_argument(args.recipe), args.overrides)
