"""Every bad-recipe fixture fails with its expected message at its expected line, through the CLI too."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.recipe import RecipeError, load_recipe

BAD = Path(__file__).parent / "data" / "bad_recipes"
CASES = sorted(BAD.glob("*.yaml"))


def expectation(path: Path) -> tuple[int, str, str]:
    """The fixture's first line: ``# expect: LINE: FIELD: message fragment`` (FIELD ``-`` for file-level errors)."""
    match = re.match(r"# expect: (\d+): ([\w.]+|-): (.+)", path.read_text().splitlines()[0])
    assert match, f"{path.name} lacks an '# expect:' header"
    return int(match.group(1)), match.group(2), match.group(3).strip()


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_bad_recipe_names_field_line_and_fix(path):
    line, field, fragment = expectation(path)
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    message = str(caught.value)
    assert f"{path}:{line}: " + ("" if field == "-" else f"{field}: ") in message
    assert fragment in message


@pytest.mark.parametrize("path", CASES[:4], ids=[p.stem for p in CASES[:4]])
def test_cli_exits_2_with_one_message_and_no_traceback(path, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["render", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert not (tmp_path / "runs").exists(), "nothing may be written for a bad recipe"


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(RecipeError, match="the recipe is empty"):
        load_recipe(empty)


def test_non_utf8_names_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: ok\nmodel:\n  id: caf\xe9\n")
    with pytest.raises(RecipeError, match=r"latin1.yaml:3: not UTF-8"):
        load_recipe(path)


def test_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]"
              for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecipeError, match="expands to more than"):
        load_recipe(path)


def test_missing_file_says_how_to_find_recipes(tmp_path):
    with pytest.raises(RecipeError, match="tuner recipes ls"):
        load_recipe(tmp_path / "nope.yaml")
