"""tuner recipes ls | show | cp, and tuner validate, through the CLI entry point."""
from __future__ import annotations

from tuner.cli import main
from tuner.recipe.registry import builtin_path


def test_ls_lists_demo_with_its_purpose(capsys):
    assert main(["recipes", "ls"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "reverse words" in out


def test_show_prints_the_file(capsys):
    assert main(["recipes", "show", "demo"]) == 0
    assert capsys.readouterr().out == builtin_path("demo").read_text()


def test_show_unknown_suggests(capsys):
    assert main(["recipes", "show", "dmeo"]) == 2
    assert "Did you mean 'demo'?" in capsys.readouterr().err


def test_cp_refuses_to_overwrite_without_force(tmp_path, capsys):
    dest = tmp_path / "mine.yaml"
    assert main(["recipes", "cp", "demo", str(dest)]) == 0
    assert dest.read_text() == builtin_path("demo").read_text()
    dest.write_text("# my edits\n")
    assert main(["recipes", "cp", "demo", str(dest)]) == 2
    assert "--force" in capsys.readouterr().err
    assert dest.read_text() == "# my edits\n", "the user's file is untouched"
    assert main(["recipes", "cp", "demo", str(dest), "--force"]) == 0
    assert dest.read_text() == builtin_path("demo").read_text()


def test_validate_prints_resolved_recipe_and_accepts_builtin_names(capsys):
    assert main(["validate", "demo", "--set", "training.micro_batch_size=8"]) == 0
    out = capsys.readouterr().out
    assert "micro_batch_size: 8" in out and "dir: runs/demo" in out


def test_python_dash_m_and_console_script(tuner_cli):
    result = tuner_cli("validate", "demo", "-q")
    assert result.returncode == 0 and result.stdout == ""
    bad = tuner_cli("validate", "demo", "--set", "memory.zero_stage=5")
    assert bad.returncode == 2 and "memory.zero_stage" in bad.stderr and "Traceback" not in bad.stderr
