"""``launch.sh`` (the exact launch command, shell-quoted) and, for GPU and multi-machine runs, ``slurm.sbatch``.

On several machines the same ``accelerate launch`` runs once per machine, each with its own
``--machine_rank``; launch.sh takes that rank as its argument and the Slurm script starts it on
every node of the allocation with the node's rank and the allocation's first host as rank 0.
"""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from tuner.recipe.schema import Recipe
from tuner.render.launch_command import launch_argv, preflight_argv, shell_command
from tuner.rundir.layout import LAUNCH_SCRIPT, SLURM_LOG, SLURM_SCRIPT

MAIN_PROCESS_IP_VARIABLE = "MAIN_PROCESS_IP"
TRAINING_GPUS_VARIABLE, VLLM_GPUS_VARIABLE = "TUNER_TRAINING_GPUS", "TUNER_VLLM_GPUS"  # grpo's vllm_server split


def vllm_server_argv(recipe: Recipe) -> list[str]:
    """``trl vllm-serve`` for grpo's vllm_server generation, sized from the recipe (TRL 1.16's flags)."""
    grpo = recipe.objective.grpo
    argv = ["trl", "vllm-serve", "--model", recipe.model.id, "--tensor_parallel_size", str(grpo.vllm_server_gpus),
            "--port", str(grpo.vllm_server_port), "--gpu_memory_utilization", str(grpo.vllm_gpu_memory_utilization),
            "--max_model_len", str(recipe.training.max_seq_length)]
    if recipe.model.revision:
        argv += ["--revision", recipe.model.revision]
    if recipe.model.trust_remote_code:
        argv += ["--trust_remote_code", "true"]
    return argv


def _vllm_server_lines(recipe: Recipe, indent: str = "") -> list[str]:
    """Start the vLLM server in the background on its own GPUs of this machine, stopped when the script ends; the
    trainer waits for it (TRL's vllm_server_timeout) and syncs its weights into it every step."""
    grpo, training = recipe.objective.grpo, recipe.hardware.gpus_per_machine
    served = ",".join(str(gpu) for gpu in range(training, training + grpo.vllm_server_gpus))
    return [f"{indent}# grpo's vLLM server (objective.grpo.generation: vllm_server) on GPUs {served} of this machine; "
            f"{VLLM_GPUS_VARIABLE}=<list> picks others",
            f'{indent}CUDA_VISIBLE_DEVICES="${{{VLLM_GPUS_VARIABLE}:-{served}}}" '
            f"{shell_command(vllm_server_argv(recipe))} &",
            f"{indent}vllm_server=$!",
            f"{indent}trap 'kill \"$vllm_server\" 2>/dev/null || true' EXIT"]


def _serves_vllm(recipe: Recipe) -> bool:
    return recipe.objective.grpo is not None and recipe.objective.grpo.generation == "vllm_server"


def _training_gpus(recipe: Recipe) -> list[str]:
    """With a vLLM server beside it, the training processes see the first gpus_per_machine GPUs only."""
    if not _serves_vllm(recipe):
        return []
    default = ",".join(str(gpu) for gpu in range(recipe.hardware.gpus_per_machine))
    return [f'export CUDA_VISIBLE_DEVICES="${{{TRAINING_GPUS_VARIABLE}:-{default}}}"  # training; the server has its '
            "own"]


def _change_to_project(run_dir: Path) -> list[str]:
    """Paths in the recipe are relative to the directory tuner ran in: return there first.  The way back holds
    the working folder's own name when the run directory lies above it (``-o ../runs/r``), so it is quoted data."""
    if run_dir.is_absolute():
        return []
    return [f'cd "$(dirname "$0")"/{shlex.quote(os.path.relpath(".", run_dir))}']


def node_commands(recipe: Recipe, run_dir: str | Path) -> list[str]:
    """The command each machine runs, in rank order (one entry on a single machine)."""
    if recipe.hardware.machines == 1:
        return [shell_command(launch_argv(run_dir))]
    return [shell_command(launch_argv(run_dir, machine_rank=rank)) for rank in range(recipe.hardware.machines)]


def render_launch_script(recipe: Recipe, run_dir: str | Path) -> str:
    """A bash script that changes to the project directory and runs the launch command."""
    run_dir = Path(run_dir)
    machines = recipe.hardware.machines
    lines = ["#!/usr/bin/env bash"]
    server = _vllm_server_lines(recipe) if _serves_vllm(recipe) else []
    if machines == 1:
        lines += ["# Written by tuner: the exact command `tuner run` launches.", "set -euo pipefail",
                  *_change_to_project(run_dir), *server, *_training_gpus(recipe),
                  shell_command(launch_argv(run_dir)) + ' "$@"']
        return "\n".join(lines) + "\n"
    ip, port = shlex.quote(str(recipe.hardware.main_process_ip)), recipe.hardware.main_process_port
    script = shlex.quote(str(run_dir / LAUNCH_SCRIPT))
    last = machines - 1
    lines += [  # comments too show every value shell-quoted: the text a user copies must be safe to paste
        f"# Written by tuner: the launch command for a run on {machines} machines.",
        f"# Start it once on every machine with that machine's rank, 0 to {last}; rank 0 ({ip}) hosts the",
        f"# rendezvous on port {port}:",
        f"#   machine 0: {script} 0",
        f"#   machine {last}: {script} {last}",
        f"# {MAIN_PROCESS_IP_VARIABLE}=<address> replaces rank 0's address (the Slurm script sets it).",
        "set -euo pipefail",
        *_change_to_project(run_dir),
        f'usage="usage: $0 MACHINE_RANK (0 to {last}), once on each machine"',
        'machine_rank="${1:?$usage}"',
        f'[[ "$machine_rank" =~ ^[0-9]+$ ]] && (( machine_rank <= {last} )) || {{ echo "$usage" >&2; exit 2; }}',
        "shift",
        f"main_process_ip=${{{MAIN_PROCESS_IP_VARIABLE}:-{ip}}}",
    ]
    placeholders = {"@RANK@": '"$machine_rank"', "@IP@": '"$main_process_ip"'}

    def with_placeholders(argv: list[str]) -> str:
        return " ".join(placeholders.get(arg, shlex.quote(arg)) for arg in argv)

    # the multi-machine preflight (tuner/preflight.py): a wrong rank, an unreachable rank 0 or a variable that
    # contradicts this launch is named here, before a rendezvous that would wait for it
    lines.append(with_placeholders(preflight_argv(run_dir, "@RANK@")))
    if server:  # on machine 0 only, and no exec: the script stops the server when training ends
        lines += ['if [[ "$machine_rank" == 0 ]]; then', *_vllm_server_lines(recipe, "  "), "fi",
                  *_training_gpus(recipe)]
    launch = with_placeholders(launch_argv(run_dir, machine_rank="@RANK@", main_process_ip="@IP@"))
    lines.append(f'{"" if server else "exec "}{launch} "$@"')
    return "\n".join(lines) + "\n"


def has_slurm_script(recipe: Recipe) -> bool:
    """GPU runs and multi-machine runs get a ``slurm.sbatch`` (a one-machine CPU run has no use for a cluster)."""
    return recipe.uses_gpu or recipe.hardware.machines > 1


def render_slurm_script(recipe: Recipe, run_dir: str | Path) -> str:
    """An sbatch script: one task per node, each running launch.sh (with its rank on several nodes)."""
    run_dir = Path(run_dir)
    hw = recipe.hardware
    script = shlex.quote(str(run_dir / LAUNCH_SCRIPT))
    lines = [
        "#!/usr/bin/env bash",
        f"# Written by tuner: submit from the project directory with `sbatch {shlex.quote(str(run_dir / SLURM_SCRIPT))}`.",
        f"# Every node runs {script}; the first node of the allocation is rank 0.",
        f"#SBATCH --job-name={recipe.name}",
        f"#SBATCH --nodes={hw.machines}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if hw.gpus_per_machine:  # a CPU job asks for no GPUs: --gpus-per-node=0 is refused where no GPU is configured
        served = recipe.objective.grpo.vllm_server_gpus if _serves_vllm(recipe) else 0  # machine 0's vLLM server
        lines.append(f"#SBATCH --gpus-per-node={hw.gpus_per_machine + served}")
    if re.fullmatch(r"[A-Za-z0-9._/-]+", str(run_dir)):  # #SBATCH lines take no shell quoting
        lines.append(f"#SBATCH --output={run_dir}/{SLURM_LOG}")
    lines.append("set -euo pipefail")
    if hw.machines == 1:
        lines.append(f"srun --kill-on-bad-exit=1 {script}")
    else:
        # assigned apart from `export` so that set -e stops the job when scontrol fails (shellcheck SC2155),
        # and without `| head`, whose early exit would fail the pipeline on a long node list
        lines += [
            'hosts="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"',
            f"{MAIN_PROCESS_IP_VARIABLE}=\"${{hosts%%$'\\n'*}}\"",
            f"export {MAIN_PROCESS_IP_VARIABLE}",
            f"srun --kill-on-bad-exit=1 bash -c 'exec \"$0\" \"$SLURM_NODEID\"' {script}",
        ]
    return "\n".join(lines) + "\n"
