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


# -- bounded reads: a recipe is read up to its limit and no further ------------------------------------------------

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_without_reading_it_all(device, tuner_cli):
    result = tuner_cli("validate", device, timeout=30)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: {device}: ") and "not a regular file" in result.stderr


def test_an_endless_stream_is_refused_at_the_limit(tmp_path):
    import subprocess
    import sys

    from tuner.recipe.io import MAX_FILE_BYTES

    # `tuner validate <(yes x)`: a pipe that never ends, under a memory limit a full read would hit
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2**31, 2**31)); "
            "from tuner.cli import main; sys.exit(main(['validate', '/dev/stdin']))")
    yes = subprocess.Popen(["yes", "name: x"], stdout=subprocess.PIPE)
    try:
        result = subprocess.run([sys.executable, "-c", code], stdin=yes.stdout, capture_output=True, text=True,
                                timeout=60, cwd=Path(__file__).parents[1])
    finally:
        yes.kill()
        yes.wait()
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: /dev/stdin: more than {MAX_FILE_BYTES} bytes is too large for a recipe.\n"


def test_a_short_stream_is_read_like_a_file(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "tuner", "validate", "-q", "/dev/stdin"], input="name: piped\n",
                            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1])
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("field", ["training.weight_decay", "method.lora.alpha", "training.max_grad_norm",
                                   "inference.gpu_headroom_gb", "hardware.host_ram_gb"])
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1.0e+400"])
def test_numbers_must_be_finite(field, value, capsys):
    from tuner.cli import main

    assert main(["validate", "demo-lora", "--set", f"{field}={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --set {field}: {field}: ") and "finite" in err and "Traceback" not in err, err
