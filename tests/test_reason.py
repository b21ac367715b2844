"""A library's words, and any error the command line prints, reach the terminal as written text: one line (or the
message's own lines), no character that moves the cursor, clears or reorders what is shown."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tuner.reason import library_words, terminal_text

HOSTILE = st.lists(st.one_of(st.characters(), st.sampled_from(["\r", "\n", "\x00", "\x1b[2J", "\u202e", "\u2028", "\t",
                                                               "\x85", "\ufeff"]))).map("".join)


def _shows_as_written(line: str) -> bool:
    return all(char == " " or char.isprintable() for char in line)


@given(text=HOSTILE, limit=st.integers(min_value=1, max_value=400))
def test_library_words_are_one_printable_line_of_bounded_length(text, limit) -> None:
    shown = library_words(ValueError(text), limit)
    assert "\n" not in shown and _shows_as_written(shown)
    assert len(shown) <= limit + 3 if " ".join(text.split()) else shown == "ValueError"  # empty: still says what


@given(lines=st.lists(HOSTILE.map(lambda text: text.replace("\n", "")), min_size=1, max_size=4))
def test_printed_errors_keep_their_lines_and_show_every_character_as_written(lines) -> None:
    shown = terminal_text("\n".join(lines))
    assert shown.count("\n") == len(lines) - 1
    assert all(_shows_as_written(line) for line in shown.split("\n"))


def test_a_column_named_by_control_characters_is_named_by_its_escapes() -> None:
    assert library_words("column '\r' and '\x00' differ\nto\n{...}") == r"column ' ' and '\x00' differ to {...}"
    assert terminal_text("a\rb\x1b[2J") == r"a\rb\x1b[2J"
    assert library_words("ab\x00", limit=4) == "ab..."  # the escape does not fit whole: cut before it
