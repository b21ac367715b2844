"""Generated docs are up to date."""
from __future__ import annotations

from conftest import REPO
from tuner.recipe.docs import render_reference


def test_recipe_reference_is_current():
    assert (REPO / "docs" / "recipes.md").read_text() == render_reference(), "run `make docs` to regenerate"


def test_every_schema_field_has_a_description():
    from pydantic import BaseModel

    from tuner.recipe.schema import Recipe

    def walk(model: type[BaseModel], prefix: str):
        for name, field in model.model_fields.items():
            assert field.description, f"{prefix}{name} has no description"
            for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    walk(arg, f"{prefix}{name}.")

    walk(Recipe, "")
