"""Where a recipe's values came from (a file's line, a ``--set``), and the error that points there.

Reading, overriding, migrating and validating all name a field the same way, so they share these.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable


class RecipeError(Exception):
    """A recipe cannot be used; ``str()`` is the message for the user (exit code 2)."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass
class RecipeSource:
    """Where recipe values came from, so an error can point at a file line or an override."""

    path: str | None = None
    key_lines: dict[tuple[str, ...], int] = field(default_factory=dict)
    overridden: set[tuple[str, ...]] = field(default_factory=set)
    # the text as written of values YAML typed as numbers, dates or booleans: where the schema wants text
    # (``name: 2018-01-01``, ``revision: 007``) the recipe gets exactly what was written
    texts: dict[tuple[str, ...], str] = field(default_factory=dict)

    def where(self, loc: tuple[str, ...]) -> str:
        for assigned in sorted(self.overridden):  # the value at loc was set, or created, by an override
            if loc and assigned[: len(loc)] == loc:
                return f"--set {'.'.join(assigned)}"
        for depth in range(len(loc) - 1, 0, -1):
            if loc[:depth] in self.overridden:
                return f"--set {'.'.join(loc[:depth])}"
        for depth in range(len(loc), 0, -1):
            if loc[:depth] in self.key_lines:
                line = self.key_lines[loc[:depth]]
                return f"{self.path}:{line}" if self.path else f"line {line}"
        return self.path or "recipe"



def field_path(loc: Iterable[str]) -> str:
    """A field path for a message; odd characters in user keys are escaped so the message stays one paragraph."""
    text = ".".join(loc)
    return text if text.isprintable() else ascii(text)[1:-1]

