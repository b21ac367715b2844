"""The ``accelerate launch`` command for a run directory, as an argument list (never a shell string)."""
from __future__ import annotations

import shlex
from pathlib import Path

from tuner.rundir.layout import ACCELERATE_CONFIG, LOCK_FILE


def launch_argv(run_dir: str | Path, machine_rank: int | str | None = None,
                main_process_ip: str | None = None) -> list[str]:
    """The launch command; on a multi-node run each machine adds its own ``machine_rank`` (and may
    override the address of rank 0, as a Slurm job does once it knows its nodes)."""
    run_dir = Path(run_dir)
    argv = ["accelerate", "launch", "--config_file", str(run_dir / ACCELERATE_CONFIG)]
    if machine_rank is not None:
        argv += ["--machine_rank", str(machine_rank)]
    if main_process_ip is not None:
        argv += ["--main_process_ip", main_process_ip]
    return argv + ["-m", "tuner.train", str(run_dir / LOCK_FILE)]


def preflight_argv(run_dir: str | Path, machine_rank: int | str) -> list[str]:
    """The multi-machine preflight one machine runs before its rendezvous (``tuner doctor --preflight``)."""
    return ["tuner", "doctor", "--preflight", "--machine-rank", str(machine_rank), str(Path(run_dir) / LOCK_FILE)]


def shell_command(argv: list[str]) -> str:
    """The argument list as one shell-quoted line (for launch.sh and for showing the user)."""
    return shlex.join(argv)
