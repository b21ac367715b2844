"""The ``accelerate launch`` command for a run directory, as an argument list (never a shell string)."""
from __future__ import annotations

import shlex
from pathlib import Path

ACCELERATE_CONFIG = "accelerate.yaml"
LOCK_FILE = "recipe.lock.yaml"


def launch_argv(run_dir: str | Path) -> list[str]:
    run_dir = Path(run_dir)
    return [
        "accelerate", "launch",
        "--config_file", str(run_dir / ACCELERATE_CONFIG),
        "-m", "tuner.train",
        str(run_dir / LOCK_FILE),
    ]


def shell_command(argv: list[str]) -> str:
    """The argument list as one shell-quoted line (for launch.sh and for showing the user)."""
    return shlex.join(argv)
