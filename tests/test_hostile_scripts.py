"""Every rendered script, of every topology, run with hostile run directories under fake launchers.

launch.sh (as machine 0 and 1 on several machines) and slurm.sbatch are executed by bash with a fake
``accelerate``, ``srun`` and ``scontrol`` first on PATH.  The fake ``accelerate`` records the argv it
receives; the test asserts it is exactly the launch command, byte for byte, and that nothing else ran
(no ``pwned`` file anywhere).  Values that cannot be quoted safely are refused when the recipe is read.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_launchers import install_fakes, run_rendered_scripts
from render_cases import CASES, case_recipe

from tuner.cli import main
from tuner.recipe.io import with_output_dir
from tuner.recipe.source import RecipeError
from tuner.render.run_directory import render_run_files
from tuner.rundir.layout import LAUNCH_SCRIPT, SLURM_SCRIPT

# Run directories a shell would read as code if any copy of them went unquoted (comments included); a ``$NAME`` in
# output.dir is refused before anything is rendered (tests/test_paths.py), so ``$`` stands here alone.
HOSTILE_DIRS = [
    "runs/$(touch pwned)", "runs/`touch pwned`", "runs/a;touch pwned", "runs/it's; touch pwned; '",
    'runs/"; touch pwned; "', "runs/a|touch pwned", "runs/a&&touch pwned", "runs/a $ b$", "runs/*",
    "runs/-rf", "runs/ünï ✓", "runs/back\\slash", "runs/a#b !x", "runs/%s %n", "runs/{a,b}", "runs/~x",
]
# Addresses of machine 0 that are legal and still look odd to a shell.
ODD_HOSTS = ["fe80::1%eth0", "node-1.cluster.", "::1", "10.0.0.1"]
# main_process_ip values that are not a host name or an address: refused, the field named.
NOT_HOSTS = ["$(touch pwned)", "`touch pwned`", "a;touch pwned", "fe80::1%$(touch pwned)", "-rf", "a b",
             "host\ntouch pwned", "x" * 64, "node_1", "", "10.0.0.1:29500"]

# Working folders (and folders holding the recipe) whose names a shell would read as code: a run directory given
# relative to them, above them (``-o ../runs/r``), makes launch.sh return to them by a path that holds their name.
HOSTILE_FOLDERS = ["p$(touch pwned)", "p`touch pwned`", "it's; touch pwned; '", 'q"; touch pwned; "',
                   "new\nline; touch pwned", "$HOME ${IFS}x", "-rf *"]


def write_scripts(project: Path, recipe, run_dir: str) -> None:
    for name, text in render_run_files(recipe, run_dir).items():
        path = project / run_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)


@pytest.mark.parametrize("topology", sorted(CASES))
def test_every_script_runs_only_the_launch_command(topology, tmp_path, demo_model_path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    env = install_fakes(tmp_path)
    base = case_recipe(topology)
    for index, run_dir in enumerate(HOSTILE_DIRS):
        recipe = with_output_dir(base, run_dir)
        if recipe.hardware.machines > 1:
            recipe = recipe.model_copy(update={"hardware": recipe.hardware.model_copy(
                update={"main_process_ip": ODD_HOSTS[index % len(ODD_HOSTS)]})})
        write_scripts(project, recipe, run_dir)
        run_rendered_scripts(project, run_dir, recipe, env)


@pytest.mark.parametrize("topology", sorted(CASES))
def test_a_hostile_working_folder_reaches_the_scripts_only_as_data(topology, tmp_path, monkeypatch) -> None:
    """``cd 'p$(touch pwned)'; tuner render RECIPE -o ../runs/r; bash runs/r/launch.sh`` runs only the launch."""
    env = install_fakes(tmp_path)
    base = case_recipe(topology)
    for index, folder in enumerate(HOSTILE_FOLDERS):
        project = tmp_path / "projects" / folder
        project.mkdir(parents=True)
        monkeypatch.chdir(project)
        run_dir = f"../runs/r{index}"
        recipe = with_output_dir(base, run_dir)
        write_scripts(project, recipe, run_dir)
        run_rendered_scripts(project, run_dir, recipe, env)


@pytest.mark.slow
def test_hostile_folders_in_cwd_output_and_recipe_path_through_the_cli(tmp_path, monkeypatch, capsys) -> None:
    """The real command line: the recipe in a hostile folder, rendered from a hostile working folder into a hostile
    output folder above it; the scripts run under the fake launchers and nothing else runs."""
    env = install_fakes(tmp_path)
    for index, folder in enumerate(HOSTILE_FOLDERS):
        project = tmp_path / "work" / folder
        recipes = project / folder
        recipes.mkdir(parents=True)
        (recipes / "r.yaml").write_text("name: hostile\nhardware: {num_processes: 2}\nmemory: {distributed: ddp}\n")
        monkeypatch.chdir(project)
        run_dir = f"../out{index}/{HOSTILE_DIRS[index][len('runs/'):]}"
        assert main(["render", f"{folder}/r.yaml", "-o", run_dir]) == 0, capsys.readouterr().err
        run_rendered_scripts(project, run_dir, with_output_dir(case_recipe("cpu_ddp_2"), run_dir), env)


@pytest.mark.parametrize("address", NOT_HOSTS)
def test_an_address_that_is_not_a_host_is_refused_naming_the_field(address, tmp_path, capsys) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: two\nhardware: {machines: 2, gpus_per_machine: 8, gpu: H100-80GB, main_process_ip: x}\n"
                      "memory: {distributed: ddp}\n")
    assert main(["render", str(recipe), "-o", str(tmp_path / "run"),
                 "--set", f"hardware.main_process_ip={json.dumps(address)}"]) == 2  # a YAML "quoted" value
    err = capsys.readouterr().err
    assert err.startswith("error: --set hardware.main_process_ip: hardware.main_process_ip: "), err
    assert "must be a host name or an IP address" in err or "control character" in err, err
    assert not (tmp_path / "run").exists()


def test_comment_lines_quote_the_values_they_show() -> None:
    recipe = with_output_dir(case_recipe("multinode_ddp_2x8"), "runs/$(touch pwned)")
    files = render_run_files(recipe, "runs/$(touch pwned)")
    for name in (LAUNCH_SCRIPT, SLURM_SCRIPT):
        for line in files[name].splitlines():
            if line.startswith("#") and "pwned" in line:
                assert "'runs/$(touch pwned)" in line, line


def test_with_output_dir_refuses_what_validation_refuses() -> None:
    with pytest.raises(RecipeError, match="control character"):
        with_output_dir(case_recipe("cpu_single"), "runs/x\ntouch pwned")
