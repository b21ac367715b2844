"""The ``accelerate launch`` command for a run directory, as an argument list (never a shell string)."""
from __future__ import annotations

import shlex
from pathlib import Path

from tuner.rundir.layout import ACCELERATE_CONFIG, ELASTIC_LOG_DIR, LOCK_FILE


def launch_argv(run_dir: str | Path, machine_rank: int | str | None = None,
                main_process_ip: str | None = None) -> list[str]:
    """The launch command; on a multi-node run each machine adds its own ``machine_rank`` (and may
    override the address of rank 0, as a Slurm job does once it knows its nodes).  ``--log_dir`` (torchrun's,
    forwarded by accelerate) keeps each rank's elastic error file in the run directory, however it is launched:
    ``tuner run``, launch.sh on each machine, or the Slurm script."""
    run_dir = Path(run_dir)
    argv = ["accelerate", "launch", "--config_file", str(run_dir / ACCELERATE_CONFIG),
            "--log_dir", str(run_dir / ELASTIC_LOG_DIR)]
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
