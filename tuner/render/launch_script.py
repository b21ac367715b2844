"""``launch.sh``: the exact launch command, shell-quoted, runnable from anywhere."""
from __future__ import annotations

import os
from pathlib import Path

from tuner.launch.argv import launch_argv, shell_command


def render_launch_script(run_dir: str | Path) -> str:
    """A bash script that changes to the project directory and runs the launch command.

    Paths in the recipe (data files, output) are relative to the directory tuner ran in,
    so the script returns there first; an absolute run directory needs no change of directory.
    """
    run_dir = Path(run_dir)
    lines = ["#!/usr/bin/env bash", "# Written by tuner: the exact command `tuner run` launches.", "set -euo pipefail"]
    if not run_dir.is_absolute():
        back = os.path.relpath(".", run_dir)
        lines.append(f'cd "$(dirname "$0")/{back}"')
    lines.append(shell_command(launch_argv(run_dir)) + ' "$@"')
    return "\n".join(lines) + "\n"
