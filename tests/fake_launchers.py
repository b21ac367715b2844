"""Fake ``accelerate``, ``tuner``, ``srun`` and ``scontrol`` for running rendered scripts: what reached the launcher
(and the multi-machine preflight, ``tuner doctor --preflight``), exactly.

The fake ``accelerate`` and ``tuner`` append their working directory and every argument they received
(NUL-separated) to ``$ARGV_DUMP``; ``srun`` runs its command once per node as that node; ``scontrol show hostnames`` lists two hosts.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tuner.render.launch_command import launch_argv, preflight_argv
from tuner.rundir.layout import LAUNCH_SCRIPT, SLURM_SCRIPT

END_OF_CALL = "--end-of-call--"
FIRST_HOST = "node001"
FAKES = {
    "accelerate": f'#!/usr/bin/env bash\nprintf "%s\\0" "$PWD" "$@" "{END_OF_CALL}" >> "$ARGV_DUMP"\n',
    "tuner": f'#!/usr/bin/env bash\nprintf "%s\\0" "$PWD" "$@" "{END_OF_CALL}" >> "$ARGV_DUMP"\n',
    "srun": '#!/usr/bin/env bash\nwhile [[ "$1" == -* ]]; do shift; done\n'
            'for ((node = 0; node < ${FAKE_NODES:-1}; node++)); do SLURM_NODEID=$node "$@" || exit; done\n',
    "scontrol": f'#!/usr/bin/env bash\n[[ "$1 $2" == "show hostnames" ]] || exit 1\nprintf "{FIRST_HOST}\\nnode002\\n"\n',
}


def install_fakes(directory: Path) -> dict[str, str]:
    """Write the fakes into ``directory/bin``; the environment that puts them first on PATH."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "ARGV_DUMP": str(directory / "argv"),
           "SLURM_JOB_NODELIST": "node[001-002]"}
    env.pop("MAIN_PROCESS_IP", None)
    return env


def calls(env: dict[str, str]) -> list[list[str]]:
    """Each call of the fake accelerate since the last look, as [cwd, *argv]."""
    dump = Path(env["ARGV_DUMP"])
    words = [word.decode() for word in dump.read_bytes().split(b"\0")[:-1]] if dump.exists() else []
    dump.unlink(missing_ok=True)
    found, call = [], []
    for word in words:
        if word == END_OF_CALL:
            found.append(call)
            call = []
        else:
            call.append(word)
    return found


def run_rendered_scripts(project: Path, run_dir: str, recipe, env: dict[str, str]) -> None:
    """Run launch.sh (as every machine) and slurm.sbatch of ``project/run_dir`` as a user would; assert the launcher
    received exactly the launch command, from the project directory, once per machine, and nothing else ran."""
    machines = recipe.hardware.machines
    script = project / run_dir / LAUNCH_SCRIPT
    outside = project.parent  # the script must find the project by itself
    if machines == 1:
        subprocess.run(["bash", str(script)], cwd=outside, env=env, check=True, timeout=30)
        assert calls(env) == [[str(project), *launch_argv(run_dir)[1:]]], run_dir
    else:
        for rank in range(machines):
            subprocess.run(["bash", str(script), str(rank)], cwd=outside, env=env, check=True, timeout=30)
            expected = launch_argv(run_dir, machine_rank=rank, main_process_ip=recipe.hardware.main_process_ip)
            assert calls(env) == [[str(project), *preflight_argv(run_dir, rank)[1:]], [str(project), *expected[1:]]], run_dir
    sbatch = project / run_dir / SLURM_SCRIPT
    if sbatch.exists():  # sbatch runs the script from the directory it was submitted in
        subprocess.run(["bash", str(sbatch)], cwd=project, env={**env, "FAKE_NODES": str(machines)}, check=True,
                       timeout=30)
        expected = ([launch_argv(run_dir)] if machines == 1 else
                    [argv for rank in range(machines) for argv in (
                        preflight_argv(run_dir, rank),
                        launch_argv(run_dir, machine_rank=rank, main_process_ip=FIRST_HOST))])
        assert calls(env) == [[str(project), *argv[1:]] for argv in expected], run_dir
    assert not list(project.parent.rglob("pwned")), f"a value was executed by the shell ({run_dir})"
