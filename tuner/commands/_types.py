"""argparse types: every argument is checked where it is typed, with argparse's usage line and one error naming it.

An argument that sets a recipe field (``--max-new-tokens``, ``--seq``) is read as that field is, with its
type and range from the schema, so the command line and the recipe refuse the same values.
"""
from __future__ import annotations

import argparse
import re
from typing import Any, Callable


def recipe_field(path: str) -> Callable[[str], Any]:
    """A type reading the text as the recipe field at ``path`` (e.g. ``inference.max_new_tokens``) is read.

    The schema is imported when an argument is parsed, not when the parser is built, so ``--help`` stays fast.
    """
    def parse(text: str) -> Any:
        from typing import Annotated

        from pydantic import TypeAdapter, ValidationError

        from tuner.recipe.schema import Recipe

        section, name = path.split(".")
        info = Recipe.model_fields[section].annotation.model_fields[name]
        try:
            value = TypeAdapter(Annotated[info.annotation, *info.metadata]).validate_python(text)
        except ValidationError as exc:
            message = exc.errors()[0]["msg"].replace("Input should be", "must be")
            raise argparse.ArgumentTypeError(f"{message} (got {text!r})") from None
        if isinstance(value, float) and value != value:  # nan passes every bound
            raise argparse.ArgumentTypeError(f"must be a number (got {text!r})")
        return value

    parse.__name__ = path  # argparse names a failed type by it
    return parse


def at_least(low: int) -> Callable[[str], int]:
    """A type for a whole number of ``low`` or more (a count, a length)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a valid integer (got {text!r})") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be greater than or equal to {low} (got {text!r})")
        return value

    parse.__name__ = f"integer of at least {low}"
    return parse


def fraction(text: str) -> float:
    """A share of something, above 0 and below 1 (e.g. the part of a device kept free)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number (got {text!r})") from None
    if not 0 < value < 1:  # nan fails both
        raise argparse.ArgumentTypeError(f"must be above 0 and below 1, e.g. 0.1 (got {text!r})")
    return value


def not_utf8(text: str) -> str | None:
    """Why ``text`` read from arguments or stdin is not UTF-8 (Python keeps such bytes as lone surrogates), or None."""
    bad = re.search("[\udc80-\udcff]", text)
    return f"not UTF-8 text (byte {ord(bad.group()) - 0xDC00:#04x})" if bad else None


def utf8_text(text: str) -> str:
    """Text as typed; bytes that are not UTF-8 are refused."""
    problem = not_utf8(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}; type it again in UTF-8")
    return text


GPUS = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?(\S.*?)\s*$")
MAX_GPUS_PER_MACHINE = 64


def gpus(text: str) -> tuple[int, str]:
    """``8xA100-80GB``, ``1xRTX4090``, ``2x48GB`` or ``A100-80GB`` -> (count, GPU type); the type is checked with the
    recipe (hardware.gpu)."""
    match = GPUS.match(text)
    if not match or (match.group(1) is None and re.fullmatch(r"[\d\sxX*]*", text)):
        raise argparse.ArgumentTypeError(f"expected N x GPU, e.g. 8xA100-80GB or 2x48GB (got {text!r})")
    count = int(match.group(1) or 1)
    if not 1 <= count <= MAX_GPUS_PER_MACHINE:
        raise argparse.ArgumentTypeError(f"1 to {MAX_GPUS_PER_MACHINE} GPUs per machine (got {count})")
    return count, match.group(2)


def host(text: str) -> str:
    """An IP address or a host name to listen on (what hardware.main_process_ip accepts)."""
    from tuner.recipe.section import is_host

    if not is_host(text):
        raise argparse.ArgumentTypeError(f"must be a host name or an IP address, e.g. 127.0.0.1 or 0.0.0.0 (got {text!r})")
    return text


def memory_budget(text: str) -> tuple[int | str, str]:
    """``0=20GiB`` or ``cpu=64GiB`` -> (device, size) for accelerate's max_memory."""
    from accelerate.utils.modeling import convert_file_size_to_int

    device, sep, size = text.partition("=")
    device = device.strip().lower()
    try:
        if not sep or not (device.isdigit() or device == "cpu") or not size.strip()[:1].isdigit():
            raise ValueError  # inf, nan and -1 are no sizes
        if convert_file_size_to_int(size.strip()) <= 0:
            raise ValueError
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE with DEVICE a GPU index or cpu and SIZE like 20GiB "
                                         f"or 500MB (got {text!r})") from None
    return (int(device) if device.isdigit() else device), size.strip()
