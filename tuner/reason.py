"""A library's own words inside one of tuner's messages: one line of printable text, of a bounded length.

Libraries' messages span lines (pyarrow's cast errors print both schemas), quote the user's bytes (a column named
"\\r" or "\\x00") and can be long; tuner's messages are one line a terminal shows as written, so every message
that quotes a library goes through :func:`library_words` -- never a hand-made squash beside it.
"""
from __future__ import annotations

import unicodedata


def library_words(exc: BaseException | str, limit: int = 300) -> str:
    """``exc``'s message (or the text) on one line: runs of white space made one space, every other character a
    terminal would not show as itself (controls, format characters such as U+202E) written as its escape, and cut
    to ``limit`` characters with "..." after; a message that is empty gives the exception's type name."""
    text = " ".join((exc if isinstance(exc, str) else str(exc)).split())
    if not text:
        return "no message" if isinstance(exc, str) else type(exc).__name__
    pieces, length = [], 0
    for char in text:
        piece = _printable(char)
        if length + len(piece) > limit:  # cut between characters, never inside an escape
            return "".join(pieces).rstrip() + "..."
        pieces.append(piece)
        length += len(piece)
    return "".join(pieces)


def terminal_text(text: str) -> str:
    """``text`` as a terminal shows it: its lines kept, every character a terminal would not show as itself (a
    carriage return that overwrites the line, NUL, escapes, U+202E) written as its escape -- what tuner prints as
    an error quotes the user's bytes (a column named "\\r") and libraries' words."""
    return "\n".join("".join(_printable(char) for char in line) for line in text.split("\n"))


def _printable(char: str) -> str:
    if char == " " or unicodedata.category(char)[0] not in "CZ":
        return char
    return char.encode("unicode_escape").decode("ascii")
