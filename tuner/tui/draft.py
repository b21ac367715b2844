"""The recipe being edited: what the user chose, field by field, checked on every change.

The draft is the model of the whole form; every box and choice is a view of it.  It keeps apart:

- ``data``: the values the user set that pass their own field's rule, sparse like a recipe file,
  so defaults that depend on other fields (dtype from mixed_precision, output.dir from name) keep
  following later changes; each as its field's own type (``1.`` machines is ``1``);
- ``typed``: the text of each box as the user typed it ("512", "1e-4"): a box's text belongs to the
  draft entry it edits, not to the widget, so opening another recipe replaces it;
- ``invalid``: the fields whose typed text their own rule refuses, with the checker's reason; such a
  value never reaches ``data``, not even its valid beginning: the field keeps the value it had before
  the typing began;
- ``origin``: the recipe as it was opened, and ``text``, its file as written, which a save edits in
  place (:mod:`tuner.tui.recipe_file`).

A box whose text ends as it began (enter, a space typed and deleted) changes nothing, so a default the
user did not change is never saved.  Every rule comes from :func:`tuner.recipe.io.validate_recipe`; the UI
copies none.  Pure Python: no textual here, so it is tested and reused without a terminal.
"""
from __future__ import annotations

import copy
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from tuner.recipe.io import parse_yaml, read_recipe_text, section_model, validate_recipe
from tuner.recipe.migration import migrate
from tuner.recipe.objective import OBJECTIVE_DATA
from tuner.recipe.overrides import leaves, set_dotted
from tuner.recipe.schema import SCHEMA_VERSION, DataSection, Recipe
from tuner.recipe.source import RecipeError

Changes = Mapping[str, Any]  # dotted field -> value; None removes the key (back to the default)
KEPT_BY_PROPOSALS = ("model", "hardware")  # what the user has, not what the advisor may change
_MISSING = object()


def _apply(data: dict[str, Any], changes: Changes) -> dict[str, Any]:
    """A copy of ``data`` with ``changes``: a change wins over a value in its way, None removes the key."""
    result = copy.deepcopy(data)
    for dotted, value in changes.items():
        set_dotted(result, dotted.split("."), copy.deepcopy(value), none_removes=True, replace_values=True)
    return _prune(result)


def _prune(data: dict[str, Any]) -> dict[str, Any]:
    """Sections left empty by removals disappear (a recipe file would not have them either)."""
    for key in [key for key, value in data.items() if isinstance(value, dict)]:
        if not _prune(data[key]):
            del data[key]
    return data


def _get(data: dict[str, Any], dotted: str, missing: Any = None) -> Any:
    target: Any = data
    for part in dotted.split("."):
        if not isinstance(target, dict) or part not in target:
            return missing
        target = target[part]
    return target


def _attribute(recipe: Recipe, dotted: str) -> Any:
    """The field as the recipe resolves it (AttributeError for a field the schema does not have)."""
    target: Any = recipe
    for part in dotted.split("."):
        target = getattr(target, part)
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


def field_value(dotted: str, value: Any) -> tuple[Any, str | None]:
    """``value``, a whole number as an integer where its field holds integers (``1.`` machines is ``1``), and why the field's own rule (type, range,
    allowed values) refuses it, or None.

    Checked on the field alone: a conflict with other fields is not the value's fault and is
    reported as a recipe error instead.
    """
    if value is None:
        return None, None
    alone = _apply({}, {dotted: value})
    try:
        recipe = Recipe.model_validate(alone)
    except ValidationError:
        _, errors = check(alone)
        return value, errors[0] if errors else f"{dotted}: not a valid value."
    read = _attribute(recipe, dotted)
    integer = isinstance(value, float) and isinstance(read, int) and not isinstance(read, bool)
    return (read if integer else value), None  # 1e3 tokens is 1000; 512 GiB stays as typed, not 512.0


def schema_values(dotted: str) -> tuple:
    """The values the schema allows for a choice field: ``typing.get_args`` of its Literal (of a list's items for a
    list field), so a screen offers exactly what a recipe accepts."""
    *sections, name = dotted.split(".")
    model: Any = Recipe
    for part in sections:
        model = section_model(model, part)
    annotation = model.model_fields[name].annotation
    pending = [annotation]
    while pending:
        current = pending.pop(0)
        if typing.get_origin(current) is Literal:
            return typing.get_args(current)
        pending += typing.get_args(current)
    raise TypeError(f"{dotted} is not a choice of the schema (no Literal)")


@dataclass(frozen=True)
class Typing:
    """A box being typed into: what it showed and what its field held before the first key."""

    shown: str
    value: Any  # _MISSING: the field was not set
    problem: str | None  # why that text was refused (a file's typo), if it was


class Draft:
    """One recipe under construction (see the module docstring for ``data``, ``typed`` and ``invalid``)."""

    def __init__(self, data: dict[str, Any] | None = None, path: Path | None = None, text: str | None = None):
        self.path = path  # the file it was opened from or saved to
        self.text = text  # that file as written: a save edits it in place (None: a new recipe)
        self.data: dict[str, Any] = {}
        self.typed: dict[str, str] = {}
        self.invalid: dict[str, str] = {}
        self.typing: dict[str, Typing] = {}  # boxes typed into since the recipe was opened
        for keys, value in leaves(copy.deepcopy(data or {})).items():
            dotted = ".".join(keys)
            if dotted == "version":
                continue
            _, problem = field_value(dotted, value)
            if problem:  # e.g. a file with a typo: shown as typed and marked, never silently dropped
                self.invalid[dotted] = problem
                self.typed[dotted] = _show(value)
            else:
                self.data = _apply(self.data, {dotted: value})  # as written: the user's file is not rewritten
        self.origin = copy.deepcopy(self.data)  # the valid part of the recipe as opened
        self.version_written = None  # an opened file's version, when older: a save bumps it
        self._validate()

    @classmethod
    def from_file(cls, path: str | Path) -> "Draft":
        text = read_recipe_text(path)
        data, source = parse_yaml(text, str(path))
        data = data if isinstance(data, dict) else {}
        version = data.get("version")
        moved = migrate(data, source)  # a file of an older schema opens in today's keys
        draft = cls(data, path=Path(path), text=text)
        for key in moved:  # and its save moves them in the file: the origin holds them where they were written
            value = _get(draft.origin, ".".join(key.new), _MISSING)
            if value is not _MISSING:
                draft.origin = _apply(draft.origin, {".".join(key.new): None, ".".join(key.old): value})
        if version != data.get("version"):
            draft.version_written = version
        return draft

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
        """The recipe the plan shows: None while a box holds a refused value (a plan of anything else would not
        be the user's) or the values disagree with each other."""
        return None if self.invalid or self.problems else self.resolved

    def value(self, dotted: str) -> Any:
        """The field as the recipe resolves it (defaults filled in)."""
        return _attribute(self.resolved, dotted)

    def written(self, dotted: str) -> Any:
        """The field as the recipe sets it, else the schema's default, before other fields resolve it
        (``model.dtype: auto``, where ``value`` says the dtype the precision makes of it)."""
        value = _get(self.data, dotted, _MISSING)
        if value is not _MISSING:
            return value
        *sections, name = dotted.split(".")
        model: Any = Recipe
        for part in sections:
            model = section_model(model, part)
        return model.model_fields[name].get_default(call_default_factory=True)

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
        """Whether the recipe already has every value in ``changes`` (None: the field is unset or None); a section,
        or a list of them (grpo's rewards), matches where the keys ``changes`` gives agree (the rest are defaults)."""
        for dotted, value in changes.items():
            try:
                current = self.value(dotted)
            except AttributeError:
                return False
            if not _agrees(current, value):
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
            if typed is not None:
                self._type(dotted, value, typed)
                continue
            self._forget(dotted)
            value, problem = field_value(dotted, value)
            if problem:
                self.invalid[dotted] = problem
                self.typed[dotted] = _show(value)
            else:
                self.data = _apply(self.data, {dotted: value})
        self._validate()
        return self.errors

    def hold(self, dotted: str, text: str) -> None:
        """Text typed in a box that applies it later (enter or leaving the box): the box shows it, the recipe
        does not have it yet."""
        self._began_typing(dotted)
        self.typed[dotted] = text

    def _type(self, dotted: str, value: Any, text: str) -> None:
        began = self._began_typing(dotted)
        self.invalid.pop(dotted, None)
        if text == began.shown:  # the box ends as it began: nothing changed, not even a default made explicit
            self._forget(dotted)
            self._set(dotted, began.value)
            if began.problem:
                self.invalid[dotted], self.typed[dotted] = began.problem, text
            return
        self.typed[dotted] = text
        value, problem = field_value(dotted, value)
        if problem:  # refused: the field keeps what it had before the typing, nothing of the text
            self.invalid[dotted] = problem
            value = began.value
        self._set(dotted, value)

    def _began_typing(self, dotted: str) -> Typing:
        if dotted not in self.typing:
            value = _get(self.data, dotted, _MISSING)
            self.typing[dotted] = Typing(self.shown(dotted), value if value is _MISSING else copy.deepcopy(value),
                                         self.invalid.get(dotted))
        return self.typing[dotted]

    def _set(self, dotted: str, value: Any) -> None:
        self.data = _apply(self.data, {dotted: None if value is _MISSING else value})

    def _forget(self, dotted: str) -> None:
        """Drop what was typed in ``dotted`` and the fields under it (a change from elsewhere replaces it)."""
        for key in [key for key in (*self.typed, *self.invalid, *self.typing)
                    if key == dotted or key.startswith(f"{dotted}.")]:
            self.typed.pop(key, None)
            self.invalid.pop(key, None)
            self.typing.pop(key, None)

    def data_following(self, objective: str) -> dict[str, Any]:
        """What choosing ``objective`` changes in the data (from the schema's OBJECTIVE_DATA): another objective's
        example data becomes this one's, read in the layout it is detected as; a layout it cannot read becomes
        its own.  The user's own data is kept."""
        wanted = OBJECTIVE_DATA[objective]
        source, layout = self.value("data.source"), self.value("data.format")
        examples = {data.example for data in OBJECTIVE_DATA.values()} - {None}
        if wanted.example and source in examples and source != wanted.example:
            default = DataSection.model_fields["source"].default
            return {"data.source": None if wanted.example == default else wanted.example,
                    **({"data.format": None} if layout != "auto" else {})}
        if layout != "auto" and layout not in wanted.formats:
            return {"data.format": wanted.formats[0]}
        return {}

    def fixed_by(self, changes: Changes) -> Recipe | None:
        """The recipe with ``changes``, when that has no errors left (what Auto-fit may start from)."""
        recipe, _ = check(_apply(self.data, changes))
        return recipe if recipe is not None and not self.invalid else None

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
        """What the user chose, defaults left implicit (``tuner validate FILE`` prints them): an opened file with
        only the changed keys changed (comments, key order and number spelling kept), a new one in schema order."""
        from tuner.tui.recipe_file import edited_text, new_text  # ruamel.yaml: loaded at the first save

        if self.text is None:
            return new_text(self.data)
        if self.version_written is None:
            return edited_text(self.text, self.origin, self.data)
        return edited_text(self.text, {"version": self.version_written, **self.origin},
                           {"version": SCHEMA_VERSION, **self.data})

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the recipe as the user chose it (``tuner run`` replays it); never replaces a file unasked, never
        creates a folder (:func:`tuner.tui.recipe_file.write_recipe` says why it cannot write)."""
        from tuner.tui.recipe_file import write_recipe

        if self.recipe is None:
            raise RecipeError(["the recipe has errors; fix them before saving:", *self.errors])
        path = write_recipe(Path(path), self.to_yaml(), overwrite)
        self.path = path
        return path


def _agrees(current: Any, value: Any) -> bool:
    """Whether a resolved value (sections as models) holds ``value``, a section's keys compared where given."""
    if isinstance(current, BaseModel):
        current = current.model_dump(mode="json")
        if isinstance(value, dict):
            return all(_agrees(current.get(key), item) for key, item in value.items())
    if isinstance(current, (list, tuple)) and isinstance(value, list):
        return len(current) == len(value) and all(map(_agrees, current, value))
    return current == value


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
