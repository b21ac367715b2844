"""The recipe: schema, validation, file I/O and the built-in registry.

Importing this package never imports torch or textual, nor (until a name below is used) the schema: the
wizard paints its first screen, which lists the built-in recipes, before pydantic builds the recipe's models.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.recipe.io import load_recipe, recipe_from_yaml, recipe_to_yaml, validate_recipe
    from tuner.recipe.schema import Recipe
    from tuner.recipe.source import RecipeError, RecipeSource

_HOME = {"Recipe": "tuner.recipe.schema", "RecipeError": "tuner.recipe.source", "RecipeSource": "tuner.recipe.source",
         **dict.fromkeys(["load_recipe", "recipe_from_yaml", "recipe_to_yaml", "validate_recipe"], "tuner.recipe.io")}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """``from tuner.recipe import load_recipe``: the module holding it is imported at first use (PEP 562)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
