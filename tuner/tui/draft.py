"""The recipe being edited: what the user chose, field by field, checked on every change.

The draft keeps three things apart:

- ``data``: the values the user set that pass their own field's rule, sparse like a recipe file,
  so defaults that depend on other fields (dtype from mixed_precision, output.dir from name) keep
  following later changes;
- ``typed``: the text of each box as the user typed it ("512", "1e-4"), shown back unchanged;
- ``invalid``: the fields whose typed text their own rule refuses, with the checker's reason; such a
  value never reaches ``data``, so the recipe is derived only from valid values.

Every rule comes from :func:`tuner.recipe.io.validate_recipe`; the UI copies none.
Pure Python: no textual here, so it is tested and reused without a terminal.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from tuner.fileio import atomic_write_text
from tuner.recipe.io import RecipeError, parse_yaml, read_recipe_text, section_model, validate_recipe
from tuner.recipe.schema import SCHEMA_VERSION, Recipe

Changes = Mapping[str, Any]  # dotted field -> value; None removes the key (back to the default)
KEPT_BY_PROPOSALS = ("model", "hardware")  # what the user has, not what the advisor may change


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
    return _prune(result)


def _prune(data: dict[str, Any]) -> dict[str, Any]:
    """Sections left empty by removals disappear (a recipe file would not have them either)."""
    for key in [key for key, value in data.items() if isinstance(value, dict)]:
        if not _prune(data[key]):
            del data[key]
    return data


def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else key))
    return out


def _get(data: dict[str, Any], dotted: str, missing: Any = None) -> Any:
    target: Any = data
    for part in dotted.split("."):
        if not isinstance(target, dict) or part not in target:
            return missing
        target = target[part]
    return target


def _differences(old: Any, new: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted field -> new value wherever ``new`` differs from ``old`` (sections compared key by key)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: dict[str, Any] = {}
        for key in new:
            out.update(_differences(old.get(key), new[key], f"{prefix}.{key}" if prefix else key))
        return out
    return {} if old == new else {prefix: new}


def check(data: dict[str, Any]) -> tuple[Recipe | None, list[str]]:
    """The validated recipe, or None and the error lines (each names its field)."""
    try:
        return validate_recipe(data), []
    except RecipeError as exc:
        return None, [_without_location(line) for line in exc.lines]


def field_problem(dotted: str, value: Any) -> str | None:
    """Why ``value`` breaks the field's own rule (type, range, allowed values), or None.

    Checked on the field alone: a conflict with other fields is not the value's fault and is
    reported as a recipe error instead.
    """
    if value is None:
        return None
    alone = _apply({}, {dotted: value})
    try:
        Recipe.model_validate(alone)
    except ValidationError:
        _, errors = check(alone)
        return errors[0] if errors else f"{dotted}: not a valid value."
    return None


class Draft:
    """One recipe under construction (see the module docstring for ``data``, ``typed`` and ``invalid``)."""

    def __init__(self, data: dict[str, Any] | None = None, path: Path | None = None):
        self.path = path  # the file it was opened from or saved to
        self.data: dict[str, Any] = {}
        self.typed: dict[str, str] = {}
        self.invalid: dict[str, str] = {}
        for dotted, value in _leaves(copy.deepcopy(data or {})).items():
            if dotted == "version":
                continue
            problem = field_problem(dotted, value)
            if problem:  # e.g. a file with a typo: shown as typed and marked, never silently dropped
                self.invalid[dotted] = problem
                self.typed[dotted] = _show(value)
            else:
                self.data = _apply(self.data, {dotted: value})
        self._validate()

    @classmethod
    def from_file(cls, path: str | Path) -> "Draft":
        data, _ = parse_yaml(read_recipe_text(path), str(path))
        return cls(data if isinstance(data, dict) else {}, path=Path(path))

    def _validate(self) -> None:
        self.resolved: Recipe = Recipe.model_validate(self.data)  # every value passed its own rule
        _, self.problems = check(self.data)

    # --- reading --------------------------------------------------------------------------------
    @property
    def errors(self) -> list[str]:
        """Everything that stops a save or a launch: refused typed values, then conflicts between fields."""
        return [*self.invalid.values(), *self.problems]

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def recipe(self) -> Recipe | None:
        """The recipe to save, render and launch; None while anything is wrong."""
        return self.resolved if self.valid else None

    @property
    def plannable(self) -> Recipe | None:
        """The recipe made of the valid values, when they agree with each other (a refused typed value
        is left out and keeps its last valid value): what the plan shows while the user types."""
        return None if self.problems else self.resolved

    def value(self, dotted: str) -> Any:
        """The field as the recipe resolves it (defaults filled in)."""
        target: Any = self.resolved
        for part in dotted.split("."):
            target = getattr(target, part)
        return target

    def shown(self, dotted: str) -> str:
        """The text a box shows for the field: what the user typed, else the value."""
        if dotted in self.typed:
            return self.typed[dotted]
        try:
            return _show(self.value(dotted))
        except AttributeError:
            return ""

    def reason(self, dotted: str) -> str | None:
        """Why the field is marked: its typed value is refused, or a rule between fields names it."""
        if dotted in self.invalid:
            return self.invalid[dotted]
        return next((line for line in self.problems if line.startswith(f"{dotted}: ")), None)

    def holds(self, changes: Changes) -> bool:
        """Whether the recipe already has every value in ``changes`` (None: the field is unset or None)."""
        for dotted, value in changes.items():
            try:
                current = self.value(dotted)
            except AttributeError:
                return False
            if isinstance(current, BaseModel):
                current = current.model_dump(mode="json")
                if isinstance(value, dict):  # a partial section matches when its keys agree
                    if any(current.get(key) != item for key, item in value.items()):
                        return False
                    continue
            if current != value:
                return False
        return True

    # --- editing --------------------------------------------------------------------------------
    def apply(self, changes: Changes, typed: str | None = None) -> list[str]:
        """Set the fields in ``changes`` and nothing else; returns the error lines.

        ``typed`` is the text the user typed for a one-field change: kept and shown as typed, and a
        value its field refuses is marked instead of entering the recipe.  A change from anywhere
        else (a choice, Auto-fit, detected hardware) replaces what was typed in its fields.
        """
        for dotted, value in changes.items():
            for key in [key for key in (*self.typed, *self.invalid) if key == dotted or key.startswith(f"{dotted}.")]:
                self.typed.pop(key, None)
                self.invalid.pop(key, None)
            if typed is not None:
                self.typed[dotted] = typed
            problem = field_problem(dotted, value)
            if problem:
                self.invalid[dotted] = problem
                if typed is None:
                    self.typed[dotted] = _show(value)
            else:
                self.data = _apply(self.data, {dotted: value})
        self._validate()
        return self.errors

    def refusal(self, changes: Changes) -> str | None:
        """Why ``changes`` would break the recipe, or None when they are acceptable.

        Only problems the change introduces count: an unrelated error the draft already has
        does not disable every other choice.
        """
        _, errors = check(_apply(self.data, changes))  # ``data`` passes every field rule: a broken one is the change's
        new = [line for line in errors if line not in self.problems]
        return new[0] if new else None

    def changes_towards(self, target: Recipe) -> dict[str, Any]:
        """The fewest field changes that make this draft resolve like ``target`` (an advisor's proposal),
        leaving the model and the hardware as they are; a field that follows the others by itself
        (output.save after a method change) stays implicit."""
        wanted = _differences(self.resolved.model_dump(mode="json"), target.model_dump(mode="json"))
        changes = {field: value for field, value in wanted.items() if field.split(".")[0] not in KEPT_BY_PROPOSALS}
        for field in list(changes):
            rest = {key: value for key, value in changes.items() if key != field}
            try:
                follows = _get(Recipe.model_validate(_apply(self.data, rest)).model_dump(mode="json"), field)
            except ValidationError:
                continue
            if follows == changes[field]:
                del changes[field]
        return changes

    def describe_changes(self, changes: Changes) -> list[str]:
        """One line per field: ``memory.zero_stage: none -> 2`` (what a proposal would do, before it does)."""
        lines = []
        for dotted, value in changes.items():
            try:
                before = self.value(dotted)
            except AttributeError:
                before = None
            if isinstance(before, BaseModel):
                before = before.model_dump(mode="json")
            lines.append(f"{dotted}: {_show(before) or 'none'} → {_show(value) or 'none'}")
        return lines

    # --- saving ---------------------------------------------------------------------------------
    def to_yaml(self) -> str:
        """What the user chose, in schema order, defaults left implicit (``tuner validate FILE`` prints them)."""
        return yaml.safe_dump(_in_schema_order({"version": SCHEMA_VERSION, **self.data}, Recipe), sort_keys=False,
                              allow_unicode=True, width=100)

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the recipe as the user chose it (``tuner run`` replays it); never replaces a file unasked."""
        if self.recipe is None:
            raise RecipeError(["the recipe has errors; fix them before saving:", *self.errors])
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(str(path))
        atomic_write_text(path, self.to_yaml())
        self.path = path
        return path


def _in_schema_order(data: dict[str, Any], model: type[BaseModel] | None) -> dict[str, Any]:
    if model is None:
        return data
    order = list(model.model_fields)
    out = {}
    for key in sorted(data, key=lambda key: order.index(key) if key in order else len(order)):
        value = data[key]
        out[key] = _in_schema_order(value, section_model(model, key)) if isinstance(value, dict) else value
    return out


def _show(value: Any) -> str:
    """A value as a box shows it: integers without '.0' ("512", not "512.0"), nothing for None."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return str(value)


def _without_location(line: str) -> str:
    """'recipe: memory.zero_stage: message' -> 'memory.zero_stage: message' (the draft has no file lines)."""
    head, sep, rest = line.partition(": ")
    return rest if sep and head == "recipe" else line
