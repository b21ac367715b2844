"""``--set dotted.key=value`` overrides and the dotted-key edits the wizard shares with them.

A value is read as YAML (so 3, true, [a, b] keep their types) and recorded in the :class:`RecipeSource`, so an
error about it points at the ``--set`` instead of a file line.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable, Sequence

import yaml

from tuner.recipe.source import RecipeError, RecipeSource


def parse_override(assignment: str) -> tuple[tuple[str, ...], Any]:
    """Split ``dotted.key=value``; the value is read as YAML (so 3, true, [a, b] keep their types)."""
    key, sep, raw_value = assignment.partition("=")
    parts = tuple(key.strip().split("."))
    if not sep or not key.strip() or any(not part for part in parts):
        raise RecipeError([f"--set {assignment!r}: expected dotted.key=value, e.g. --set training.micro_batch_size=4"])
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else ""
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError):
        value = raw_value  # not a YAML value (unclosed bracket, year 0, ...): keep the text as typed
    return parts, value


def leaves(data: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every value of a recipe mapping by its key path (``("training", "micro_batch_size")``); an empty section is a
    value of its own, so a file's ``fsdp: {}`` is kept where it was written."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix: data}
    out: dict[tuple[str, ...], Any] = {}
    for key, value in data.items():
        out.update(leaves(value, (*prefix, key)))
    return out


class NotASection(ValueError):
    """A dotted key runs through a value; ``str()`` is the dotted key of that value."""


def set_dotted(data: dict[str, Any], parts: Sequence[str], value: Any, *, none_removes: bool,
               replace_values: bool) -> None:
    """Set the key ``parts`` (``("training", "micro_batch_size")``) of ``data`` to ``value`` in place, making the
    sections on the way (a missing or null one becomes ``{}``).

    The two callers differ, and each states how: ``none_removes``: None deletes the key, so the field is back to its
    default (the wizard's changes), instead of writing YAML's null for the schema to judge (``--set key=null``);
    ``replace_values``: a value where a section belongs gives way to the section (the wizard: the change wins)
    instead of raising :class:`NotASection` (``--set`` tells the user which key they typed through).
    """
    target = data
    for depth, part in enumerate(parts[:-1]):
        child = target.get(part)
        if child is None or (replace_values and not isinstance(child, dict)):
            child = target[part] = {}
        elif not isinstance(child, dict):
            raise NotASection(".".join(parts[: depth + 1]))
        target = child
    if value is None and none_removes:
        target.pop(parts[-1], None)
    else:
        target[parts[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str], source: RecipeSource) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``dotted.key=value`` applied, recording them in ``source``."""
    result = copy.deepcopy(data)
    for assignment in overrides:
        parts, value = parse_override(assignment)
        raw_value = assignment.partition("=")[2]
        try:
            set_dotted(result, parts, value, none_removes=False, replace_values=False)
        except NotASection as exc:
            raise RecipeError([f"--set {assignment}: {exc} is a value, not a section."]) from None
        source.overridden.add(parts)
        if value is not None and not isinstance(value, (str, dict, list)):
            source.texts[parts] = raw_value.strip()
    return result

