"""The recipe: schema, validation, file I/O and the built-in registry.

Importing this package never imports torch or textual.
"""
from tuner.recipe.io import (
    RecipeError,
    RecipeSource,
    load_recipe,
    recipe_from_yaml,
    recipe_to_yaml,
    validate_recipe,
)
from tuner.recipe.schema import Recipe

__all__ = [
    "Recipe",
    "RecipeError",
    "RecipeSource",
    "load_recipe",
    "recipe_from_yaml",
    "recipe_to_yaml",
    "validate_recipe",
]
