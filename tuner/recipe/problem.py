"""A conflict between recipe fields: the field to change, why and how, and where to point when it is absent."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    anchor: str | None = None  # key whose line to show when ``field`` itself is not in the file
