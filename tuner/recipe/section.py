"""The base of every recipe section and the text rules it holds every value to (also used by the checks)."""
from __future__ import annotations

import ipaddress
import re
import typing
import unicodedata
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator

from tuner.fileio import hidden_character_problem, output_folder

_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_ZONE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _admits_only_numbers(annotation) -> bool:
    """int/float fields and Literal[0, 1, ...]: where YAML's true/false would silently read as 1/0."""
    if annotation in (int, float):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return all(isinstance(arg, (int, float)) and not isinstance(arg, bool) for arg in args)
    if args and origin is not list:  # a union: numbers (or none) only
        return any(_admits_only_numbers(arg) for arg in args) and all(
            arg is type(None) or _admits_only_numbers(arg) for arg in args)
    return False


MAX_NAME_BYTES = 255  # one file or folder name (every text may become part of a path)
_NOT_TEXT = {"Cc": "a control character", "Cs": "a byte that is not UTF-8"}  # unicodedata categories


def not_text(text: str) -> str | None:
    """What in ``text`` cannot be one line of text -- a control character (newline, tab, NUL, ESC, ...) or a lone
    surrogate (a byte that was not UTF-8, or a YAML "\\ud800") -- escaped for a message; None when nothing."""
    for character in text:
        kind = _NOT_TEXT.get(unicodedata.category(character))
        if kind:
            return f"{kind} ({ascii(character)[1:-1]})"
    return None


def _shown_as_it_is(text: str) -> str:
    problem = hidden_character_problem(text)
    if problem:
        raise ValueError(problem)
    return text


# a path (or a hub id) the recipe names: no character that shows it other than it is (bidi, zero-width)
PathText = Annotated[str, AfterValidator(_shown_as_it_is)]
# a folder tuner writes: that, and ~ expanded, a $VAR or an unknown ~user refused (fileio.output_folder)
OutputFolder = Annotated[str, AfterValidator(output_folder)]


def is_host(text: str) -> bool:
    """An IPv4/IPv6 address or a DNS host name (RFC 1123 labels): nothing a shell or a URL would read twice."""
    address, _, zone = text.partition("%")  # an IPv6 zone (fe80::1%eth0) names an interface, nothing more
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is not None:
        return not zone or (ip.version == 6 and bool(_ZONE.match(zone)))
    return len(text) <= 253 and all(_HOST_LABEL.match(label) for label in text.removesuffix(".").split("."))


class Section(BaseModel):
    """Base for every recipe section: unknown keys are errors, assignments are validated; true/false are not
    numbers, every number is finite (an infinite weight decay trains to nan and still "finishes"), and no text holds
    a control character (every value may end up in a script, a path or a log line)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value, info: ValidationInfo):
        if isinstance(value, bool) and _admits_only_numbers(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _one_line_of_text(cls, value):
        for text in (value if isinstance(value, list) else [value]):
            if not isinstance(text, str):
                continue
            found = not_text(text)
            if found:
                raise ValueError(f"contains {found}; remove it (names and paths are one line of text)")
            if any(len(part.encode()) > MAX_NAME_BYTES for part in text.split("/")):
                raise ValueError(f"has a part longer than {MAX_NAME_BYTES} bytes between slashes; a file system "
                                 "allows no longer file name: shorten it")
        return value
