"""Recipes of an older schema keep loading; a recipe of a newer one is refused.

A moved key is read from where it was, with a warning naming the line, the old key and the new one.  A recipe newer than this tuner is refused: its keys may mean what this
version cannot know (Accelerate's ``process_config`` and axolotl's ``deprecated.py`` do the same for theirs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.recipe.schema import SCHEMA_VERSION
from tuner.recipe.source import RecipeError, RecipeSource, field_path

MOVED: dict[tuple[str, ...], tuple[tuple[str, ...], int]] = {  # old key -> (new key, the version that moved it)
    ("memory", key): (("training", key), 2)
    for key in ("micro_batch_size", "gradient_accumulation_steps", "max_seq_length", "optimizer")
}


@dataclass(frozen=True)
class Moved:
    old: tuple[str, ...]
    new: tuple[str, ...]
    warning: str  # for the user: where, the old key, the new one


def migrate(data: dict[str, Any], source: RecipeSource) -> list[Moved]:
    """Move every old key of ``data`` (in place; its sections are copied, not edited) to its new place and set
    ``version``.  Raises :class:`RecipeError` for a recipe newer than this tuner or one that sets a key in both."""
    version = data.get("version", SCHEMA_VERSION)
    numbered = isinstance(version, int) and not isinstance(version, bool)
    if numbered and version > SCHEMA_VERSION:
        raise RecipeError([f"{source.where(('version',))}: version: {version} is a newer recipe schema than this "
                           f"tuner reads (version {SCHEMA_VERSION}); upgrade tuner (pip install -U tuner)."])
    moved = []
    for old, (new, since) in MOVED.items():
        section, target = data.get(old[0]), data.get(new[0], {})
        if not isinstance(section, dict) or old[1] not in section or not isinstance(target, dict):
            continue  # nothing to move, or a section that is not a mapping, which the schema names
        by_override = old in source.overridden
        if new[1] in target and by_override == (new in source.overridden):  # an override wins over the file
            raise RecipeError([f"{source.where(old)}: {field_path(old)}: moved to {field_path(new)} in recipe version "
                               f"{since}, which {source.where(new)} also sets; keep only {field_path(new)}."])
        where, replaces = source.where(old), new[1] not in target or by_override
        data[old[0]], data[new[0]] = section, target = dict(section), dict(target)
        value = section.pop(old[1])
        if replaces:
            target[new[1]] = value
            for seen in (source.key_lines, source.texts):  # errors about the value point where it was written
                if old in seen:
                    seen[new] = seen.pop(old)
            if by_override:
                source.overridden.add(new)
        moved.append(Moved(old, new, f"{where}: {field_path(old)} is now {field_path(new)} (recipe version {since}); "
                                     + ("read from there. " if replaces else f"{source.where(new)} overrides it. ")
                                     + f"Move it under {new[0]}: to silence this."))
    if numbered and version < SCHEMA_VERSION:
        data["version"] = SCHEMA_VERSION
    return moved

