"""Things a valid recipe does that a user should know before running it.

Pure: commands (and the TUI) print these; nothing here refuses a recipe.
"""
from __future__ import annotations

import re
from pathlib import Path

from tuner.catalog.models import custom_code
from tuner.recipe.rewards import split_function
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
            f"model.trust_remote_code: the Python code shipped with {model.id!r}{shipped} runs with your permissions: "
            "tuner plan (and run and probe, which plan first) imports it to build the model's classes, and "
            "training, inference and export run it on every rank; " + (
                "it is pinned to a commit by model.revision." if pinned else
                "pin model.revision to a commit hash you have reviewed, or set trust_remote_code: false.")
        )
    grpo = recipe.objective.grpo if recipe.objective.kind == "grpo" else None
    for index, reward in enumerate(grpo.rewards if grpo else ()):
        if reward.kind == "function" and reward.function:
            path = split_function(reward.function)[0]
            warnings.append(
                f"objective.grpo.rewards.{index}.function: training imports and runs the Python file "
                f"{Path(path).expanduser().resolve()} on every rank with your permissions (validate and plan only "
                "read it as text); review it before running a recipe you did not write.")
    return warnings
