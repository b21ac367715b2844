"""Generate ``docs/recipes.md`` from the schema's field descriptions: ``python -m tuner.recipe.docs``.

The descriptions are written once, in the schema; this page, the CLI help and the TUI's
help all read them, so they cannot drift apart (a test regenerates the page and compares).
"""
from __future__ import annotations

import typing

from pydantic import BaseModel

from tuner.recipe.migration import MOVED
from tuner.recipe.schema import SCHEMA_VERSION, Recipe

HEADER = """# Recipe reference

A recipe is one YAML file, the single source of truth of a run. Every key is optional;
`tuner validate FILE` prints the recipe with every default filled in, and any key can be
overridden on the command line with `--set section.key=value`.

This page is generated from the schema by `python -m tuner.recipe.docs` (`make docs`);
do not edit it by hand.
"""


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # a checked str (section.PathText) is a str to the reader
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " \\| ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(field) -> str:
    if field.default_factory is not None:
        return "see below"
    return "null" if field.default is None else f"`{field.default}`"


def _nested_models(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _nested_models(arg)]


def _section(model: type[BaseModel], prefix: str, out: list[str]) -> None:
    rows, nested = [], []
    for name, field in model.model_fields.items():
        models = _nested_models(field.annotation)
        key = f"{prefix}{name}"
        if models:
            nested.append((key, models[0], field))
            continue
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
    if rows:
        out += ["| key | type | default | description |", "|---|---|---|---|", *rows, ""]
    for key, sub, field in nested:
        out += [f"## `{key}`", "", field.description or "", ""]
        _section(sub, f"{key}.", out)


def render_reference() -> str:
    out = [HEADER, "## top level", ""]
    _section(Recipe, "", out)
    out += ["## keys that moved", "",
            f"A recipe of an older schema (its `version` below {SCHEMA_VERSION}) still loads: each key below is read "
            "from where it was, with a warning naming its line and its new place, and the wizard saves it at the new "
            "place. A recipe whose `version` is newer than this tuner is refused.", "",
            "| old key | new key | moved in version |", "| --- | --- | --- |",
            *(f"| `{'.'.join(old)}` | `{'.'.join(new)}` | {since} |" for old, (new, since) in MOVED.items()), ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render_reference(), end="")
