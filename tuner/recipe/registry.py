"""Built-in recipes shipped in the repository's ``recipes/`` folder (``tuner recipes ls|show|cp``)."""
from __future__ import annotations

import os
from pathlib import Path

from tuner.recipe.io import RecipeError, parse_yaml, read_recipe_text


def recipes_dir() -> Path:
    override = os.environ.get("TUNER_RECIPES_DIR")
    return Path(override) if override else Path(__file__).resolve().parents[2] / "recipes"


def builtin_names() -> list[str]:
    return sorted(path.stem for path in recipes_dir().glob("*.yaml"))


def builtin_path(name: str) -> Path:
    path = recipes_dir() / f"{name.removesuffix('.yaml')}.yaml"
    if not path.is_file():
        import difflib

        close = difflib.get_close_matches(name, builtin_names(), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else f" Built-in recipes: {', '.join(builtin_names())}."
        raise RecipeError([f"no built-in recipe named {name!r}.{hint}"])
    return path


def describe(name: str) -> str:
    """First comment line of a built-in recipe: what it is for."""
    for line in read_recipe_text(builtin_path(name)).splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def resolve_recipe_argument(argument: str) -> Path:
    """A recipe argument is a file path, or the name of a built-in recipe."""
    path = Path(argument)
    if path.exists() or argument.endswith((".yaml", ".yml")) or os.sep in argument:
        return path
    return builtin_path(argument)


__all__ = ["builtin_names", "builtin_path", "describe", "recipes_dir", "resolve_recipe_argument", "parse_yaml"]
