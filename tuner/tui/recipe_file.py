"""Writing the wizard's recipe to a file: an opened recipe edited in place, a new one in schema order.

An opened file is the user's document: only the keys whose values changed are touched, through ruamel.yaml's
round trip, so its comments, key order, quoting and number spelling (``1.0e-4``) stay as written.  New keys go
where the schema puts them among the keys already there; a comment that sat between a removed key and the next
one stays before the next one.  Every value written reads back the same through tuner's own YAML 1.1 loader.

Saving never creates a folder and never replaces a file unasked; a place it cannot write to is one message
saying why (:func:`save_problem`), checked before anything is written.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from tuner.fileio import atomic_write_text, special_kind
from tuner.recipe.io import section_model
from tuner.recipe.overrides import leaves
from tuner.recipe.schema import SCHEMA_VERSION, Recipe

_MISSING = object()


def new_text(data: dict[str, Any]) -> str:
    """A new recipe file: what the user chose, in schema order, defaults left implicit."""
    return yaml.safe_dump(_in_schema_order({"version": SCHEMA_VERSION, **data}, Recipe), sort_keys=False,
                          allow_unicode=True, width=100)


def _in_schema_order(data: dict[str, Any], model: type[BaseModel] | None) -> dict[str, Any]:
    if model is None:
        return data
    order = list(model.model_fields)
    out = {}
    for key in sorted(data, key=lambda key: order.index(key) if key in order else len(order)):
        value = data[key]
        out[key] = _in_schema_order(value, section_model(model, key)) if isinstance(value, dict) else value
    return out


# --- an opened file, edited in place -----------------------------------------------------------------------------
def edited_text(text: str, before: dict[str, Any], after: dict[str, Any]) -> str:
    """``text``, the file ``before`` was read from, with exactly the values that differ in ``after`` changed."""
    from ruamel.yaml.util import load_yaml_guess_indent

    round_trip = _round_trip()
    document, sequence_indent, dash_offset = load_yaml_guess_indent(text, yaml=round_trip)
    round_trip.map_indent = _mapping_indent(text)  # the file's own indentation (ruamel writes 2 otherwise)
    if dash_offset is not None:  # and its lists' (ruamel guesses these only)
        round_trip.sequence_indent, round_trip.sequence_dash_offset = sequence_indent, dash_offset
    old, new = leaves(before), leaves(after)
    for path in old:
        if path not in new and not any(key[:len(path)] == path for key in new):
            _delete(document, path)
    for path, value in new.items():
        if old.get(path, _MISSING) != value:
            _set(document, path, value)
    out = io.StringIO()
    round_trip.dump(document, out)
    return out.getvalue()


def _mapping_indent(text: str) -> int:
    """How far the file indents a section's keys (the first key line under a top-level ``section:``)."""
    section = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if section and indent and not stripped.startswith("-"):
            return indent
        section = indent == 0 and stripped.endswith(":")
    return 2


def _round_trip():
    from ruamel.yaml import YAML

    round_trip = YAML()
    round_trip.preserve_quotes = True
    round_trip.width = 4096  # never re-wrap the user's long lines
    # a new number as tuner's loader (YAML 1.1) reads it back: 1.0e-05, not 1e-05 (which it would read as text)
    round_trip.representer.add_representer(float, lambda representer, value: representer.represent_scalar(
        "tag:yaml.org,2002:float", yaml.safe_dump(value).removesuffix("\n...\n").strip()))
    return round_trip


def _schema_of(path: tuple[str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Recipe
    for part in path:
        model = section_model(model, part) if model else None
    return model


def _node(value: Any, old: Any = None) -> Any:
    """A value to write: text YAML 1.1 would read as something else is quoted, and the old value's quoting and
    list style are kept."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString, ScalarString

    if isinstance(value, dict):
        return CommentedMap((key, _node(item)) for key, item in value.items())
    if isinstance(value, list):
        sequence = CommentedSeq(_node(item) for item in value)
        if not isinstance(old, list) or old.fa.flow_style():
            sequence.fa.set_flow_style()
        return sequence
    if isinstance(value, str):
        if isinstance(old, ScalarString):
            return type(old)(value)
        try:
            plain = yaml.safe_load(value) == value and "\n" not in value
        except yaml.YAMLError:
            plain = False
        return value if plain else DoubleQuotedScalarString(value)
    return value


def _set(document, path: tuple[str, ...], value: Any) -> None:
    from ruamel.yaml.comments import CommentedMap

    mapping = document
    for depth, part in enumerate(path[:-1]):
        child = mapping.get(part)
        if not isinstance(child, CommentedMap):
            child = CommentedMap()
            _put(mapping, path[:depth], part, child)
        mapping = child
    key = path[-1]
    if key in mapping:
        mapping[key] = _node(value, mapping[key])  # ruamel keeps the key's own comment
    else:
        _put(mapping, path[:-1], key, _node(value))


def _put(mapping, where: tuple[str, ...], key: str, value: Any) -> None:
    """Insert a new ``key`` after the last key the schema orders before it (the comments that followed that
    key move below the new one: they belong to what comes next)."""
    model = _schema_of(where)
    order = list(model.model_fields) if model else []
    keys = list(mapping)
    rank = order.index(key) if key in order else len(order)
    before = [index for index, existing in enumerate(keys) if (order.index(existing) if existing in order
                                                               else len(order)) <= rank]
    index = before[-1] if before else -1
    following = _take_following_comments(mapping, keys[index]) if index >= 0 else ""
    mapping.insert(index + 1, key, value)
    _add_following_comments(mapping, key, following)


def _delete(document, path: tuple[str, ...]) -> None:
    """Remove the key at ``path`` and any section it leaves empty, keeping the comments that followed it."""
    from ruamel.yaml.comments import CommentedMap

    parents = [document]
    for part in path[:-1]:
        child = parents[-1].get(part)
        if not isinstance(child, CommentedMap):
            return
        parents.append(child)
    for depth in range(len(path) - 1, -1, -1):
        mapping, key = parents[depth], path[depth]
        if key not in mapping or (depth < len(path) - 1 and len(mapping[key])):
            return
        keys = list(mapping)
        following = _take_following_comments(mapping, key)
        del mapping[key]
        position = keys.index(key)
        if position:
            _add_following_comments(mapping, keys[position - 1], following)
        elif following and depth:  # the first key of a section: the comment goes under the section's own key
            _comment_slot(parents[depth - 1], path[depth - 1], 3, list).append(_comment(following))


def _comment(text: str):
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    return CommentToken(text, CommentMark(0), None)


def _comment_slot(mapping, key: str, index: int, empty=lambda: None):
    slots = mapping.ca.items.setdefault(key, [None, None, None, None])
    if slots[index] is None:
        slots[index] = empty()
    return slots[index]


def _take_following_comments(mapping, key: str) -> str:
    """Cut the whole-line comments after ``key``'s line (ruamel keeps them with the key above them)."""
    from ruamel.yaml.comments import CommentedMap

    value = mapping[key]
    if isinstance(value, CommentedMap) and len(value):
        return _take_following_comments(value, list(value)[-1])
    slots = mapping.ca.items.get(key)
    if not slots or slots[2] is None:
        return ""
    own, newline, following = slots[2].value.partition("\n")
    if own:
        slots[2].value = own + newline
    else:
        slots[2] = None
    return following


def _add_following_comments(mapping, key: str, comments: str) -> None:
    from ruamel.yaml.comments import CommentedMap

    if not comments:
        return
    value = mapping[key]
    if isinstance(value, CommentedMap) and len(value):
        _add_following_comments(value, list(value)[-1], comments)
        return
    token = _comment_slot(mapping, key, 2)
    if token is None:
        mapping.ca.items[key][2] = _comment("\n" + comments)
    else:
        token.value += comments


# --- where it goes -----------------------------------------------------------------------------------------------
def save_problem(path: Path) -> str | None:
    """Why the recipe cannot be saved at ``path`` (one line that says what to do), or None when it can."""
    if path.is_dir():
        return f"{path}: is a folder; give a file name, e.g. {path / 'recipe.yaml'}."
    if path.exists() and special_kind(path):
        return f"{path}: is {special_kind(path)}, not a recipe file; choose another name."
    folder = path.parent
    if not folder.exists():
        return f"{folder}: no such folder; create it first, or save the recipe in a folder that exists."
    if not folder.is_dir():
        return f"{folder}: is a file, not a folder; choose another place."
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"{path}: cannot write here (permission denied); choose a folder you can write to."
    return None


def write_recipe(path: Path, text: str, overwrite: bool = False) -> Path:
    """Write ``text`` at ``path``: FileExistsError for a file there unless ``overwrite``; a place it cannot write
    to raises :class:`SaveRefused` before anything is written, and nothing is created but the file itself."""
    problem = save_problem(path)
    if problem:
        raise SaveRefused(problem)
    if path.exists() and not overwrite:
        raise FileExistsError(str(path))
    try:
        return atomic_write_text(path, text)
    except OSError as exc:  # e.g. a read-only file system, a full disk
        raise SaveRefused(f"{path}: cannot write: {exc.strerror or exc}.") from None


class SaveRefused(OSError):
    """The recipe cannot be written where asked; ``str()`` says why and what to do."""

    def __str__(self) -> str:
        return self.args[0]
