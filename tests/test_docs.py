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


def test_every_planner_source_is_explained_in_the_memory_docs():
    """Plans are claims: every `source` key an item of the plan carries is a bracketed key in docs/memory.md."""
    import re

    code = "\n".join(path.read_text() for path in sorted((REPO / "tuner" / "planner").glob("*.py")))
    keys = {key for expression in re.findall(r"source=([^,)]*(?:\n[^,)]*)?)", code)
            for key in re.findall(r'(?:^|else )"([a-z0-9-]+)"', expression.strip())}  # the keys, not conditions
    documented = set(re.findall(r"`\[([a-z0-9-]+)\]`", (REPO / "docs" / "memory.md").read_text()))
    assert keys and not keys - documented, sorted(keys - documented)
