"""Built-in recipes shipped as package data in ``tuner/recipes/`` (``tuner recipes ls|show|cp|check``).

The demos sit at the top (``demo``, ``demo-lora``); real-model recipes sit in one folder per model family and are
named as torchtune names its configs, ``<family>/<size>-<method>[-<variant>]`` (``llama3.1/8b-qlora``).
"""
from __future__ import annotations

import os
import re
from importlib.resources import files
from pathlib import Path

DEMO_FAMILY = "demo"
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # no '..', no absolute paths


def recipes_dir() -> Path:
    override = os.environ.get("TUNER_RECIPES_DIR")
    if override:
        return Path(override)
    # package data: a real folder both in a checkout and in an installed wheel (tuner is never imported from a zip)
    return Path(str(files("tuner") / "recipes"))


def builtin_names() -> list[str]:
    root = recipes_dir()
    return sorted(path.relative_to(root).with_suffix("").as_posix() for path in root.rglob("*.yaml"))


def family(name: str) -> str:
    """The family folder of a built-in recipe (``llama3.1``), or ``demo`` for the ones at the top."""
    return name.split("/")[0] if "/" in name else DEMO_FAMILY


def builtin_path(name: str) -> Path:
    name = name.removesuffix(".yaml")
    path = recipes_dir() / f"{name}.yaml"
    if not _NAME.match(name) or not path.is_file():
        import difflib

        from tuner.recipe.source import RecipeError  # the schema loads at the first recipe read, not with the names

        close = difflib.get_close_matches(name, builtin_names(), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else " List them with `tuner recipes ls`."
        raise RecipeError([f"no built-in recipe named {name!r}.{hint}"])
    return path


def starting_recipe(recipe):
    """The built-in recipe whose result ``recipe`` starts from (its ``model.id``, or a distill recipe's teacher, is
    that recipe's ``final/``, e.g. demo-dpo after demo), when that result is not there yet; None when the model
    exists or is no such result."""
    from tuner.recipe.io import load_recipe, starting_model
    from tuner.rundir.layout import FINAL_DIR

    start = Path(starting_model(recipe))
    if start.exists() or start.name != FINAL_DIR:
        return None
    for name in builtin_names():
        candidate = load_recipe(builtin_path(name))
        if Path(candidate.output.dir) == start.parent:
            return candidate
    return None


def planned_as(recipe):
    """The recipe to plan for ``recipe``: one that starts from another built-in recipe's result not trained yet is
    planned on that recipe's model (the same architecture)."""
    from tuner.recipe.io import with_starting_model

    first = starting_recipe(recipe)
    return recipe if first is None else with_starting_model(recipe, first.model.id)


def describe(name: str) -> str:
    """First comment line of a built-in recipe: what it is for."""
    from tuner.recipe.io import read_recipe_text

    for line in read_recipe_text(builtin_path(name)).splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def resolve_recipe_argument(argument: str) -> Path:
    """A recipe argument is a file path, or the name of a built-in recipe (``demo``, ``llama3.1/8b-qlora``)."""
    path = Path(argument)
    if path.exists():
        return path
    if argument.removesuffix(".yaml") in builtin_names():
        return builtin_path(argument)
    if argument.endswith((".yaml", ".yml")) or os.sep in argument:
        return path
    return builtin_path(argument)


__all__ = ["builtin_names", "builtin_path", "describe", "family", "recipes_dir", "resolve_recipe_argument"]
