"""One module per concept: none of tuner's modules grows past 450 lines; one that would is split by what it does."""
from __future__ import annotations

from conftest import REPO

MOST_LINES = 450


def test_no_module_of_tuner_is_over_450_lines():
    sizes = {path.relative_to(REPO).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in (REPO / "tuner").rglob("*.py")}
    assert len(sizes) > 100  # the whole package was read
    over = {path: lines for path, lines in sorted(sizes.items()) if lines > MOST_LINES}
    assert over == {}, f"split these by concern (at most {MOST_LINES} lines each): {over}"
