"""The recipe being edited: one sparse dict of what the user chose, validated on every change.

The draft keeps only the values the user set (like a recipe file does), so defaults that
depend on other fields (dtype from mixed_precision, output.dir from name) follow later
changes.  Every rule comes from :func:`tuner.recipe.io.validate_recipe`; the UI copies none.
Pure Python: no textual here, so it is tested and reused without a terminal.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from tuner.fileio import atomic_write_text
from tuner.recipe.io import RecipeError, parse_yaml, read_recipe_text, recipe_to_yaml, validate_recipe
from tuner.recipe.schema import Recipe

Changes = Mapping[str, Any]  # dotted field -> value; None removes the key (back to the default)


def _apply(data: dict[str, Any], changes: Changes) -> dict[str, Any]:
    result = copy.deepcopy(data)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        target = result
        for part in parents:
            child = target.get(part)
            if not isinstance(child, dict):
                child = target[part] = {}
            target = child
        if value is None:
            target.pop(leaf, None)
        else:
            target[leaf] = copy.deepcopy(value)
    return result


def check(data: dict[str, Any]) -> tuple[Recipe | None, list[str]]:
    """The validated recipe, or None and the error lines (each names its field)."""
    try:
        return validate_recipe(data), []
    except RecipeError as exc:
        return None, list(exc.lines)


class Draft:
    """One recipe under construction; ``recipe`` is the last valid state, ``errors`` the current problems."""

    def __init__(self, data: dict[str, Any] | None = None, path: Path | None = None):
        self.data: dict[str, Any] = copy.deepcopy(data) if data else {}
        self.path = path  # the file it was opened from or saved to
        self.recipe: Recipe | None = None
        self.errors: list[str] = []
        self.last_valid: Recipe = Recipe()
        self._validate()

    @classmethod
    def from_file(cls, path: str | Path) -> "Draft":
        data, _ = parse_yaml(read_recipe_text(path), str(path))
        return cls(data, path=Path(path))

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> "Draft":
        return cls(recipe.model_dump(mode="json"))

    def _validate(self) -> None:
        self.recipe, self.errors = check(self.data)
        if self.recipe is not None:
            self.last_valid = self.recipe

    @property
    def valid(self) -> bool:
        return self.recipe is not None

    def value(self, dotted: str) -> Any:
        """The field as the last valid recipe resolves it (defaults filled in)."""
        target: Any = self.last_valid
        for part in dotted.split("."):
            target = getattr(target, part)
        return target

    def holds(self, changes: Changes) -> bool:
        """Whether the recipe already has every value in ``changes`` (None: the field is unset or None)."""
        for dotted, value in changes.items():
            try:
                current = self.value(dotted)
            except AttributeError:
                return False
            if hasattr(current, "model_dump"):
                current = current.model_dump(mode="json")
                if isinstance(value, dict):  # a partial section matches when its keys agree
                    if any(current.get(key) != item for key, item in value.items()):
                        return False
                    continue
            if current != value:
                return False
        return True

    def apply(self, changes: Changes) -> list[str]:
        """Set fields (even to an invalid value: the user sees why); returns the error lines."""
        self.data = _apply(self.data, changes)
        self._validate()
        return self.errors

    def replace(self, recipe: Recipe) -> None:
        """Take a whole recipe (an advisor's proposal, an opened file)."""
        self.data = recipe.model_dump(mode="json")
        self._validate()

    def refusal(self, changes: Changes) -> str | None:
        """Why ``changes`` would break the recipe, or None when they are acceptable.

        Only problems the change introduces count: an unrelated error the draft already has
        does not disable every other choice.
        """
        _, errors = check(_apply(self.data, changes))
        new = [line for line in errors if line not in self.errors]
        return _without_location(new[0]) if new else None

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the fully resolved recipe (what ``tuner run`` replays); never replaces a file unasked."""
        if self.recipe is None:
            raise RecipeError(["the recipe has errors; fix them before saving:", *self.errors])
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(str(path))
        atomic_write_text(path, recipe_to_yaml(self.recipe))
        self.path = path
        return path


def _without_location(line: str) -> str:
    """'recipe: memory.zero_stage: message' -> 'memory.zero_stage: message' (the draft has no file lines)."""
    head, sep, rest = line.partition(": ")
    return rest if sep and head == "recipe" else line
