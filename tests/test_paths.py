"""Paths as the user meant them: ``~`` in output.dir and -o expands as it does for model.id, a ``$VAR`` left as
written or a ``~`` naming no home is refused with the reason, and no path tuner takes (in the recipe or on the
command line) may hold a character that shows it other than it is (bidi controls, zero-width characters)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.cli import main
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_path

HIDDEN = [*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)), *map(chr, range(0x200B, 0x2010)),
          "\u2060", "\ufeff"]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return home


@pytest.mark.parametrize("how", ["-o", "output.dir"])
def test_a_tilde_in_the_run_directory_is_the_home(how, home, tmp_path, capsys) -> None:
    args = ["-o", "~/runs/x"] if how == "-o" else ["--set", "output.dir=~/runs/x"]
    assert main(["render", "demo", *args]) == 0, capsys.readouterr().err
    assert (home / "runs" / "x" / "launch.sh").is_file()
    assert load_recipe(home / "runs" / "x" / "recipe.lock.yaml").output.dir == str(home / "runs" / "x")
    assert not list(tmp_path.glob("~*")), "a folder literally named ~"


@pytest.mark.parametrize("folder, reason", [
    ("$HOME", "holds $HOME, an environment variable tuner does not expand"),
    ("runs/${USER}/x", "holds ${USER}, an environment variable tuner does not expand"),
    ("~", "holds files tuner did not write"),  # the home itself: expanded, then refused as the user's folder
    ("~no-such-user-here/x", "starts with '~no-such-user-here', which names no user's home here"),
    ("runs/~/x", "has a folder named '~', which a shell reads as your home"),
])
@pytest.mark.parametrize("how", ["-o", "output.dir"])
def test_a_folder_the_shell_would_have_expanded_is_refused_with_the_reason(folder, reason, how, home, tmp_path,
                                                                          capsys) -> None:
    (home / "notes.txt").write_text("mine")
    args = ["-o", folder] if how == "-o" else ["--set", f"output.dir={json.dumps(folder)}"]
    assert main(["render", "demo", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and reason in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"] and [p.name for p in home.iterdir()] == ["notes.txt"]


def test_model_id_and_output_dir_expand_alike(home) -> None:
    """What the recipe reads as a home-relative model folder it writes home-relative too."""
    from tuner.fileio import output_folder, user_path

    assert output_folder("~/x") == str(user_path("~/x")) == str(home / "x")


RECIPE_PATHS = ["model.id", "data.source", "output.dir", "training.resume", "inference.offload_folder",
                "hardware.nvme_path"]
CLI_PATHS = [["render", "{path}"], ["render", "demo", "-o", "{path}"], ["infer", "--model", "{path}", "--prompt", "hi"],
             ["eval", "demo", "--adapter", "{path}"], ["merge", "{path}"], ["export", "{path}"],
             ["infer", "demo", "--input", "{path}", "--output", "out.jsonl"], ["recipes", "cp", "demo", "{path}"]]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.text(alphabet="abc/._-", max_size=8), after=st.text(alphabet="xyz/._-", max_size=8),
       hidden=st.sampled_from(HIDDEN), where=st.integers(0, len(RECIPE_PATHS) + len(CLI_PATHS) - 1))
def test_a_path_holding_a_character_that_hides_it_is_refused_wherever_it_is_given(
        tmp_path, capsys, monkeypatch, before, after, hidden, where) -> None:
    """Every bidi control (U+202A-202E, U+2066-2069) and zero-width character (U+200B-200F, U+2060, U+FEFF), anywhere
    in any path of the recipe or the command line: exit 2, the field or flag and the character named (escaped, so
    the terminal shows the message as it is), nothing written."""
    monkeypatch.chdir(tmp_path)
    path = f"p{before}{hidden}{after}"  # not an option
    if where < len(RECIPE_PATHS):
        field = RECIPE_PATHS[where]
        code = main(["render", "demo", "--set", f"{field}={json.dumps(path)}"])
        expected = f"{field}: contains"
    else:
        code = main([arg.format(path=path) for arg in CLI_PATHS[where - len(RECIPE_PATHS)]])
        expected = ": contains"
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err and f"(U+{ord(hidden):04X})" in err and hidden not in err, err
    assert list(tmp_path.iterdir()) == []


def test_hidden_characters_in_text_that_is_not_a_path_are_kept() -> None:
    """A right-to-left mark belongs in Arabic text: only paths refuse it."""
    recipe = load_recipe(builtin_path("demo"), ["name=demo"])
    assert recipe.name == "demo"
    from tuner.recipe.schema import Recipe

    assert Recipe.model_validate({"objective": {"kind": "grpo", "grpo": {"rewards": [
        {"kind": "exact_match", "column": "answer\u200f"}]}}}).objective.grpo.rewards[0].column == "answer\u200f"
