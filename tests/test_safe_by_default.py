"""Safe by default: hostile names pass through launches literally, remote code needs consent, recipes are data."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_launchers import calls, install_fakes

from tuner.cli import main
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_path
from tuner.recipe.schema import Recipe
from tuner.recipe.warnings import recipe_warnings
from tuner.render.launch_command import launch_argv, preflight_argv, shell_command

REPO = Path(__file__).resolve().parents[1]
HOSTILE = [
    "with space", "it's", 'say "hi"', "$(touch pwned)", "a;touch pwned", "`touch pwned`", "*", "-rf", "$HOME",
    "back\\slash", "ünï ✓", "a|b&c>d",
]
# refused when the recipe is read, wherever they appear: a newline in a comment line of a script is a new command
CONTROL = ["line\nbreak", "tab\there", "nul\x00", "escape\x1b[2J", "cr\rlf", "del\x7f"]


@pytest.mark.parametrize("name", CONTROL)
def test_control_characters_in_names_and_paths_are_refused_naming_the_field(name, tmp_path, capsys) -> None:
    assert main(["render", "demo", "-o", str(tmp_path / name)]) == 2
    assert capsys.readouterr().err.startswith("error: -o/--output: output.dir: contains a control character")
    assert main(["validate", "demo", "--set", f"model.id={json.dumps(name)}"]) == 2  # a YAML "quoted\\nvalue"
    assert capsys.readouterr().err.startswith("error: --set model.id: model.id: contains a control character")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", HOSTILE)
def test_the_launch_command_quotes_every_name(name) -> None:
    argv = launch_argv(Path("runs") / name)
    assert str(Path("runs") / name / "recipe.lock.yaml") in argv
    assert argv[argv.index("--log_dir") + 1] == str(Path("runs") / name / "elastic")
    assert shlex.split(shell_command(argv)) == argv


@pytest.fixture
def fake_launchers(tmp_path) -> dict[str, str]:
    """``accelerate`` and ``tuner`` first on PATH, recording every argv they receive, byte for byte."""
    return install_fakes(tmp_path / "fakes")


@pytest.mark.slow
def test_launch_sh_passes_hostile_run_directories_byte_for_byte(tmp_path, monkeypatch, fake_launchers, capsys) -> None:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    extra = ["--extra", "arg with space", "$(touch pwned)"]
    for name in [name for name in HOSTILE if name != "$HOME"]:  # a folder named $HOME is refused (test_paths.py)
        run_dir = Path("runs") / name
        assert main(["render", "demo", "-o", str(run_dir)]) == 0, capsys.readouterr().err
        script = run_dir / "launch.sh"
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
        if shutil.which("shellcheck"):
            # info-level SC2016 ("expressions don't expand in single quotes") is the point of the quoting
            check = subprocess.run(["shellcheck", "--severity=warning", str(script)], capture_output=True, text=True)
            assert check.returncode == 0, check.stdout
        # run from elsewhere: the script must return to the project directory by itself
        subprocess.run(["bash", str(project / script), *extra], cwd=tmp_path, env=fake_launchers, check=True, timeout=30)
        assert calls(fake_launchers) == [[str(project), *launch_argv(run_dir)[1:], *extra]], name
    assert not list(tmp_path.rglob("pwned")), "a name was executed by the shell"


@pytest.mark.slow
def test_absolute_run_directory_needs_no_cd(tmp_path, fake_launchers, capsys) -> None:
    run_dir = tmp_path / "runs" / "it's $(touch pwned); x"
    assert main(["render", "demo", "-o", str(run_dir)]) == 0, capsys.readouterr().err
    assert "cd " not in (run_dir / "launch.sh").read_text()
    subprocess.run(["bash", str(run_dir / "launch.sh")], cwd="/", env=fake_launchers, check=True, timeout=30)
    assert calls(fake_launchers) == [["/", *launch_argv(run_dir)[1:]]]
    assert not list(tmp_path.rglob("pwned"))


@pytest.mark.parametrize("model_id", [name for name in HOSTILE if name.strip()])
def test_model_names_travel_in_the_lock_file_never_on_the_command_line(model_id, tmp_path, capsys) -> None:
    recipe = yaml.safe_load(builtin_path("demo").read_text())
    recipe["model"]["id"] = model_id
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
    run_dir = tmp_path / "run"
    assert main(["render", str(path), "-o", str(run_dir)]) == 0, capsys.readouterr().err
    assert load_recipe(run_dir / "recipe.lock.yaml").model.id == model_id
    assert model_id not in (run_dir / "launch.sh").read_text()


# -- trust_remote_code -----------------------------------------------------------------------------------------

def test_remote_code_is_off_unless_the_recipe_sets_it(capsys) -> None:
    assert Recipe().model.trust_remote_code is False
    assert load_recipe(builtin_path("demo")).model.trust_remote_code is False
    assert recipe_warnings(load_recipe(builtin_path("demo"))) == []
    assert main(["validate", "-q", "demo"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_remote_code_warns_naming_the_model(capsys) -> None:
    code = main(["validate", "-q", "demo", "--set", "model.trust_remote_code=true", "--set", "model.id=acme/sneaky-7b"])
    err = capsys.readouterr().err
    assert code == 0
    assert err.startswith("warning: model.trust_remote_code:") and "'acme/sneaky-7b'" in err
    assert "pin model.revision" in err
    pinned = Recipe.model_validate({"model": {"id": "acme/x", "trust_remote_code": True, "revision": "a" * 40}})
    assert "pinned to a commit" in recipe_warnings(pinned)[0]


def test_plan_says_a_models_code_runs_before_it_plans(capsys) -> None:
    """Planning builds the model's classes, so with trust_remote_code the model's code runs in tuner plan itself:
    the warning comes first and says so."""
    assert main(["plan", "demo", "--set", "model.trust_remote_code=true"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: model.trust_remote_code:")
    assert "tuner plan (and run and probe, which plan first) imports it to build the model's classes" in captured.err


REWARD_GRPO = ("objective:\n  kind: grpo\n  grpo:\n    num_generations: 2\n    rewards:\n"
               "      - {{kind: function, function: '{spec}'}}\ntraining:\n  micro_batch_size: 2\n")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(up=st.integers(0, 2), down=st.lists(st.sampled_from(["a", "b c", "ünï"]), max_size=2),
       absolute=st.booleans(), command=st.sampled_from(["validate", "plan"]))
def test_validate_and_plan_name_every_reward_file_whose_code_training_runs(tmp_path_factory, capsys, up, down,
                                                                          absolute, command) -> None:
    """Wherever the reward's file is (beside the recipe, below it, ../ above it, an absolute path), validate and plan
    name the resolved file that training will import, and run none of it (the file raises when run)."""
    root = tmp_path_factory.mktemp("reward")
    recipe_dir = root.joinpath("x", "y", "z")
    recipe_dir.mkdir(parents=True)
    code_dir = recipe_dir.joinpath(*[".."] * up, *down)
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "score.py").write_text("raise RuntimeError('ran')\ndef score(**_):\n    return []\n")
    spec = f"{(code_dir / 'score.py').resolve() if absolute else Path(*[os.pardir] * up, *down, 'score.py')}:score"
    (recipe_dir / "recipe.yaml").write_text(REWARD_GRPO.format(spec=spec))
    assert main([command, *(["-q"] if command == "validate" else []), str(recipe_dir / "recipe.yaml")]) == 0
    err = capsys.readouterr().err
    assert (f"warning: objective.grpo.rewards.0.function: training imports and runs the Python file "
            f"{(code_dir / 'score.py').resolve()} on every rank") in err


# -- recipes are data, launches are argument lists -------------------------------------------------------------

FORBIDDEN = {
    r"(?<![.\w])eval\(": "eval of text",
    r"(?<![.\w])exec\(": "exec of text",
    r"yaml\.(unsafe_load|full_load|load_all)\(|FullLoader|UnsafeLoader|yaml\.Loader\b": "an unsafe YAML loader",
    r"yaml\.load\((?![^)]*SafeLoader)": "yaml.load without SafeLoader",
    r"_component_|_target_": "Hydra/torchtune-style object construction from config text",
    r"\bpickle\.loads?\(|\bmarshal\.loads?\(": "unpickling",
    r"shell\s*=\s*True": "a shell",
    r"\bos\.(system|popen)\(": "a shell",
    r"torch\.load\((?![^)]*weights_only\s*=\s*True)": "torch.load without weights_only=True",
}
# Importing by name takes a string literal or an f-string inside tuner's own package; the one exception
# is `tuner doctor` trying its fixed list of optional extensions.
IMPORT_BY_NAME = re.compile(r"\b(__import__|import_module)\((?!\s*[\"']|\s*f[\"']tuner\.)|\bimportlib\.util\.spec_from|\brunpy\.")
ALLOWED_IMPORTS = {("tuner/doctor/libraries.py", "importlib.import_module(module)"),
                   # the recipe package's lazy exports: a fixed table of its own modules (PEP 562)
                   ("tuner/recipe/__init__.py", "importlib.import_module(_HOME[name])"),
                   # the traced image step: transformers' Qwen-VL modelling modules, a fixed table (_QWEN_MODULES)
                   ("tuner/loading/image_batch.py",
                    'importlib.import_module(f"transformers.models.{name}.modeling_{name}")'),
                   # a grpo reward the recipe names (function: file.py:name), imported by the training ranks only
                   ("tuner/train/rewards.py", "importlib.util.spec_from_file_location(module_name, path)")}


def test_recipes_are_data_and_launches_use_argument_lists() -> None:
    offenders = []
    for path in sorted((REPO / "tuner").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = re.sub(r"#.*$", "", line)
            for pattern, why in FORBIDDEN.items():
                if re.search(pattern, code):
                    offenders.append(f"{relative}:{number}: {why}: {line.strip()}")
            if IMPORT_BY_NAME.search(code):
                if not any(relative == file and snippet in code for file, snippet in ALLOWED_IMPORTS):
                    offenders.append(f"{relative}:{number}: import by name: {line.strip()}")
    assert offenders == [], "\n".join(offenders)


@pytest.mark.slow
def test_multi_node_launch_sh_passes_rank_address_and_names_literally(tmp_path, monkeypatch, fake_launchers, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    address = "fe80::1"
    run_dir = Path("runs") / "it's; $(touch pwned)"
    assert main(["render", "demo", "-o", str(run_dir), "--set", "hardware.machines=2", "--set", "hardware.gpus_per_machine=1",
                 "--set", "hardware.gpu=24GB", "--set", "memory.distributed=ddp", "--set", "memory.mixed_precision=bf16",
                 "--set", "model.dtype=bfloat16", "--set", f"hardware.main_process_ip={address}"]) == 0, capsys.readouterr().err
    script = run_dir / "launch.sh"
    if shutil.which("shellcheck"):
        check = subprocess.run(["shellcheck", "--severity=warning", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout
    here = str(tmp_path)
    subprocess.run(["bash", str(script), "1", "--extra"], env=fake_launchers, check=True, timeout=30)
    assert calls(fake_launchers) == [[here, *preflight_argv(run_dir, 1)[1:]],
                                     [here, *launch_argv(run_dir, machine_rank=1, main_process_ip=address)[1:], "--extra"]]
    # the address Slurm (or a user) puts in MAIN_PROCESS_IP at run time is passed on as one word, never run
    hostile = "$(touch pwned) 'x'"
    subprocess.run(["bash", str(script), "0"], env={**fake_launchers, "MAIN_PROCESS_IP": hostile}, check=True, timeout=30)
    assert calls(fake_launchers)[-1] == [here, *launch_argv(run_dir, machine_rank=0, main_process_ip=hostile)[1:]]
    bad = subprocess.run(["bash", str(script), "1; touch pwned"], env=fake_launchers, capture_output=True, timeout=30)
    assert bad.returncode == 2 and not calls(fake_launchers)
    assert not list(tmp_path.rglob("pwned"))


def test_infer_warns_about_remote_code_before_loading_the_model(capsys) -> None:
    code = main(["infer", "demo", "--set", "model.trust_remote_code=true", "--set", "model.id=acme/not-cached-7b",
                 "--prompt", "hello"])
    err = capsys.readouterr().err
    assert code == 2  # not in the cache offline: the load fails, after the warning
    assert err.index("warning: model.trust_remote_code:") < err.index("error: model.id:")
    assert "'acme/not-cached-7b'" in err.split("error:")[0]


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install shellcheck)")
def test_every_rendered_script_passes_shellcheck(tmp_path, demo_model_path) -> None:
    """launch.sh and slurm.sbatch of every topology tuner renders (the render tests' matrix)."""
    from render_cases import CASES, case_recipe

    from tuner.render.run_directory import render_run_files

    scripts = []
    for name in CASES:
        for file_name, text in render_run_files(case_recipe(name), Path("runs") / name).items():
            if file_name.endswith((".sh", ".sbatch")):
                scripts.append(tmp_path / f"{name}-{file_name}")
                scripts[-1].write_text(text)
    check = subprocess.run(["shellcheck", "--severity=warning", *map(str, scripts)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    assert len(scripts) > len(CASES)
