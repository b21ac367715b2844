"""Reading and writing recipe files: safe YAML, key line numbers, validation, clear errors.

Only ``yaml.SafeLoader`` is used: a recipe is data, never code.  Every error is a
:class:`RecipeError` that names the field and, when it came from a file, the line.  ``--set`` overrides live in
:mod:`tuner.recipe.overrides`, keys of an older schema in :mod:`tuner.recipe.migration`.
"""
from __future__ import annotations

import difflib
import logging
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from tuner.fileio import NotARegularFile, TooLarge, read_limited
from tuner.recipe.checks import find_problems
from tuner.recipe.migration import MOVED, migrate
from tuner.recipe.overrides import apply_overrides
from tuner.recipe.schema import Recipe
from tuner.recipe.source import RecipeError, RecipeSource, field_path

log = logging.getLogger(__name__)

MAX_YAML_NODES = 20_000  # a recipe has ~100; anything near this is an alias bomb or not a recipe
MAX_FILE_BYTES = 1_000_000
MAX_YAML_DEPTH = 32  # sections are two or three deep
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_SAFE_TAGS = {tag for tag in yaml.SafeLoader.yaml_constructors if tag}  # str, int, map, timestamp, ...; no python/*
_TEXT_TAGS = (_STR_TAG, "tag:yaml.org,2002:null")


def _walk_mapping(node: yaml.Node, prefix: tuple[str, ...], source: RecipeSource, budget: list[int],
                  loader: yaml.SafeLoader) -> None:
    """Record the line of every key; refuse duplicate and non-name keys, unreadable values, alias bombs, deep nesting."""
    path, lines = source.path, source.key_lines
    where = path or "recipe"
    budget[0] -= 1
    if budget[0] < 0:
        raise RecipeError([f"{where}: the YAML expands to more than {MAX_YAML_NODES} nodes "
                           "(anchors/aliases too deep?); a recipe is a small mapping of settings."])
    if len(prefix) > MAX_YAML_DEPTH:
        raise RecipeError([f"{where}:{node.start_mark.line + 1}: {field_path(prefix[:3])}...: nested more than "
                           f"{MAX_YAML_DEPTH} levels deep (a recursive alias?); a recipe is a few sections deep."])
    if node.tag not in _SAFE_TAGS:
        raise RecipeError([f"{where}:{node.start_mark.line + 1}: {field_path(prefix) or 'recipe'}: the tag "
                           f"{node.tag.replace('tag:yaml.org,2002:', '!!')} is not allowed; a recipe is plain data."])
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in (_STR_TAG, _MERGE_TAG):
                kind = key_node.tag.rsplit(":", 1)[-1]
                if not isinstance(key_node, yaml.ScalarNode):
                    raise RecipeError([f"{where}:{line}: {field_path(prefix) or 'recipe'}: keys must be names, not a {kind}."])
                raise RecipeError([f"{where}:{line}: {field_path(prefix + (key_node.value,))}: keys must be names, not "
                                   f"{kind} {key_node.value!r}; quote the key if you meant the text."])
            key = key_node.value
            if key in seen:
                raise RecipeError([f"{where}:{line}: {field_path(prefix + (key,))}: duplicate key (first set on line "
                                   f"{seen[key]}); keep one of them."])
            seen[key] = line
            lines[prefix + (key,)] = line
            _walk_mapping(value_node, prefix + (key,), source, budget, loader)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines.setdefault(prefix + (str(index),), item.start_mark.line + 1)
            _walk_mapping(item, prefix + (str(index),), source, budget, loader)
    else:
        try:  # a scalar YAML can tokenise but Python cannot hold: year 0, an integer of 5000 digits
            loader.construct_object(node)
        except (ValueError, OverflowError) as exc:
            raise RecipeError([f"{where}:{node.start_mark.line + 1}: {field_path(prefix) or 'recipe'}: "
                               f"cannot read this value: {exc}."]) from None
        if node.tag not in _TEXT_TAGS:
            source.texts[prefix] = node.value


def _yaml_problem(exc: yaml.YAMLError, where: str) -> RecipeError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = " ".join(filter(None, [exc.context, exc.problem]))
        return RecipeError([f"{where}{line}: not valid YAML: {problem}. Check indentation and quoting."])
    return RecipeError([f"{where}: not valid YAML: {exc}"])


def parse_yaml(text: str, path: str | None = None) -> tuple[dict[str, Any], RecipeSource]:
    """Parse recipe YAML into a plain dict plus the line of every key."""
    where = path or "recipe"
    try:
        loader = yaml.SafeLoader(text)  # the reader rejects control characters here
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        raise RecipeError([f"{where}:{line}: the character {exc.character:#06x} is not allowed in YAML; "
                           "remove it."]) from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise RecipeError([f"{where}: the recipe is empty; start from a built-in one: tuner recipes cp demo my.yaml"])
        if not isinstance(node, yaml.MappingNode):
            raise RecipeError([f"{where}:{node.start_mark.line + 1}: a recipe must be a mapping of sections "
                               f"(model:, hardware:, method:, ...), not a {node.tag.rsplit(':', 1)[-1]}."])
        source = RecipeSource(path=path)
        _walk_mapping(node, (), source, [MAX_YAML_NODES], loader)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _yaml_problem(exc, where) from None
    except RecursionError:
        raise RecipeError([f"{where}: nested too deeply to be a recipe; a recipe is a few sections deep."]) from None
    except (ValueError, OverflowError) as exc:  # e.g. a date out of range, an integer of 5000 digits
        raise RecipeError([f"{where}: cannot read a value: {exc}."]) from None
    finally:
        loader.dispose()
    return data, source


def read_recipe_text(path: str | Path) -> str:
    """The recipe file's text, read up to :data:`MAX_FILE_BYTES` and no further (a pipe such as ``<(yes)`` is cut
    off at the limit, a device such as /dev/zero refused before reading)."""
    path = Path(path)
    try:
        raw = read_limited(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        raise RecipeError([f"{path}: no such file. List the built-in recipes with: tuner recipes ls"]) from None
    except NotARegularFile as exc:
        raise RecipeError([f"{path}: not a regular file ({exc.kind}); give the recipe's .yaml file."]) from None
    except TooLarge:
        raise RecipeError([f"{path}: more than {MAX_FILE_BYTES} bytes is too large for a recipe."]) from None
    except OSError as exc:
        raise RecipeError([f"{path}: cannot read: {exc.strerror}."]) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise RecipeError([f"{path}:{line}: not UTF-8 text (byte {raw[exc.start]:#04x}); save the file as UTF-8."]) from None


def _suggest(loc: tuple[str, ...]) -> str:
    """'did you mean' for an unknown key, from the fields of the section it sits in."""
    model: type[BaseModel] = Recipe
    for part in loc[:-1]:
        nested = section_model(model, part)
        if nested is None:
            return ""
        model = nested
    moved_here = {old[-1]: moved for old, moved in MOVED.items() if old[:-1] == loc[:-1]}
    matches = difflib.get_close_matches(loc[-1], [*model.model_fields, *moved_here], n=1, cutoff=0.6)
    if matches and matches[0] in moved_here:
        new, since = moved_here[matches[0]]
        return f" Did you mean '{field_path(new)}' (moved from {field_path(loc[:-1])}: in recipe version {since})?"
    if matches:
        return f" Did you mean '{matches[0]}'?"
    return f" Known keys here: {', '.join(model.model_fields)}."


def section_model(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    """The section class of ``model``'s field ``key`` (e.g. Recipe, "memory" -> MemorySection), or None for a value."""
    info = model.model_fields.get(key)
    return _model_in(getattr(info, "annotation", None)) if info else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found:
            return found
    return None


def _wants_text(loc: tuple[str, ...]) -> bool:
    """Whether the schema field at ``loc`` (a list item when the last part is an index) holds free text."""
    import typing

    model: type[BaseModel] | None = Recipe
    annotation: Any = None
    for depth, part in enumerate(loc):
        if model is None:
            return depth == len(loc) - 1 and part.isdigit() and any(
                typing.get_origin(arg) is list and typing.get_args(arg) == (str,)
                for arg in (annotation, *typing.get_args(annotation)))
        info = model.model_fields.get(part)
        if info is None:
            return False
        annotation, model = info.annotation, _model_in(info.annotation)
    return annotation is str or str in typing.get_args(annotation)


def _restore_texts(data: Any, texts: dict[tuple[str, ...], str]) -> None:
    """Put back the written text of numbers, dates and booleans that sit where the schema wants text."""
    for loc, text in texts.items():
        parent = data
        for part in loc[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else (
                parent[int(part)] if isinstance(parent, list) and part.isdigit() and int(part) < len(parent) else None)
        key: Any = loc[-1]
        if isinstance(parent, list) and key.isdigit() and int(key) < len(parent):
            key = int(key)
        elif not (isinstance(parent, dict) and key in parent):
            continue
        value = parent[key]
        if value is not None and not isinstance(value, (str, dict, list)) and _wants_text(loc):
            parent[key] = text


def _input_loc(loc: tuple, data: Any) -> tuple[str, ...]:
    """The keys of ``loc`` that exist in the input: pydantic adds union members ('list[str]') and validators."""
    keys = []
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        elif isinstance(part, str) and ("[" in part or part.startswith("function-")):
            continue  # a union member or validator name, not a key of the recipe
        else:
            data = None
        keys.append(str(part))
    return tuple(keys)


def _format_validation_error(error: ValidationError, data: dict, source: RecipeSource) -> list[str]:
    lines = []
    for item in error.errors():
        loc = _input_loc(item["loc"], data)
        dotted = field_path(loc) or "recipe"
        where = source.where(loc)
        if item["type"] == "extra_forbidden":
            lines.append(f"{where}: {dotted}: unknown key.{_suggest(loc)}")
            continue
        message = item["msg"]
        if item["type"] == "literal_error":
            message = message.replace("Input should be", "must be")
        elif item["type"] == "model_type":
            message = "must be a section of key: value lines"
        elif item["type"] == "value_error":  # the schema's own words
            message = message.removeprefix("Value error, ")
        given = item.get("input")
        shown = repr(given) if not isinstance(given, (dict, list)) else type(given).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        lines.append(f"{where}: {dotted}: {message} (got {shown}).")
    # the same field can fail several union members; keep each line once
    return list(dict.fromkeys(lines))


def _problem_location(problem, source: RecipeSource) -> str:
    loc = tuple(problem.field.split("."))
    if problem.anchor and loc not in source.key_lines and loc not in source.overridden:
        loc = tuple(problem.anchor.split("."))
    return source.where(loc)


def validate_recipe(data: Any, source: RecipeSource | None = None) -> Recipe:
    """Turn plain data into a checked :class:`Recipe`, or raise :class:`RecipeError`."""
    source = source or RecipeSource()
    if not isinstance(data, dict):
        raise RecipeError([f"{source.where(())}: a recipe must be a mapping of sections, not {type(data).__name__}."])
    data = dict(data)
    for moved in migrate(data, source):
        log.warning("%s", moved.warning)
    _restore_texts(data, source.texts)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_format_validation_error(exc, data, source)) from None
    problems = find_problems(recipe)
    if problems:
        raise RecipeError([f"{_problem_location(p, source)}: {p.field}: {p.message}" for p in problems])
    return recipe


def load_recipe(path: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    """Read, override and validate a recipe file (a grpo reward's file is found relative to the recipe's folder, a
    reward model's run directory gives the model it saved)."""
    from tuner.recipe.rewards import resolve_reward_paths

    text = read_recipe_text(path)
    data, source = parse_yaml(text, str(path))
    data = apply_overrides(data, overrides, source)
    resolve_reward_paths(data, Path(path).parent)
    return validate_recipe(data, source)


def with_output_dir(recipe: Recipe, directory: str | Path) -> Recipe:
    """The recipe run in ``directory`` instead of its own output.dir (``-o``), checked like any other value."""
    if str(directory) == recipe.output.dir:
        return recipe
    data = recipe.model_dump(mode="json")
    data["output"]["dir"] = str(directory)
    return validate_recipe(data, RecipeSource(path="-o/--output"))


def with_model_id(recipe: Recipe, model_id: str | Path) -> Recipe:
    """The recipe starting from another model (e.g. a run's final/), checked like any other value."""
    data = recipe.model_dump(mode="json")
    data["model"]["id"] = str(model_id)
    return validate_recipe(data)


def starting_model(recipe: Recipe) -> str:
    """The model another run's result may be: the teacher a distill recipe learns from, else model.id."""
    return recipe.objective.teacher if recipe.objective.kind == "distill" else recipe.model.id


def with_starting_model(recipe: Recipe, model_id: str | Path) -> Recipe:
    """The recipe with :func:`starting_model` replaced (the teacher of a distill recipe, else model.id)."""
    if recipe.objective.kind != "distill":
        return with_model_id(recipe, model_id)
    data = recipe.model_dump(mode="json")
    data["objective"]["teacher"] = str(model_id)
    return validate_recipe(data)


def recipe_to_yaml(recipe: Recipe) -> str:
    """The fully resolved recipe as YAML: every default explicit, sections in schema order."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True, width=100)


def recipe_from_yaml(text: str, path: str | None = None) -> Recipe:
    data, source = parse_yaml(text, path)
    return validate_recipe(data, source)
