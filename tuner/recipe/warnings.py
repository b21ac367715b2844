"""Things a valid recipe does that a user should know before running it.

Pure: commands (and the TUI) print these; nothing here refuses a recipe.
"""
from __future__ import annotations

import re

from tuner.catalog.models import custom_code
from tuner.recipe.schema import Recipe

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def recipe_warnings(recipe: Recipe) -> list[str]:
    """One sentence per risk, naming the field and the model."""
    warnings = []
    model = recipe.model
    if model.trust_remote_code:
        pinned = model.revision is not None and _COMMIT.match(model.revision)
        classes = custom_code(model.id, model.revision)
        shipped = f" ({', '.join(classes)})" if classes else ""
        warnings.append(
            f"model.trust_remote_code: the Python code shipped with {model.id!r}{shipped} will run on every rank with "
            "your permissions; " + ("it is pinned to a commit by model.revision." if pinned else
                                    "pin model.revision to a commit hash you have reviewed, or set trust_remote_code: "
                                    "false.")
        )
    return warnings
