"""Launch a rendered run directory and follow it to the end: the path shared by ``tuner run`` and ``tuner demo``."""
from __future__ import annotations

import sys
from pathlib import Path

from tuner.launch.failures import describe_failure
from tuner.launch.progress import ProgressView
from tuner.launch.runner import Launch
from tuner.render.launch_command import launch_argv
from tuner.run_layout import CHECKPOINTS_DIR


def launch_and_follow(run_dir: Path, quiet: bool = False) -> int:
    """Run ``accelerate launch`` for ``run_dir`` showing progress; Ctrl-C stops every rank. Returns the exit code."""
    launch = Launch(launch_argv(run_dir), run_dir)
    view = ProgressView()
    try:
        with view:
            code = launch.wait(on_events=None if quiet else view.update)
    except KeyboardInterrupt:
        print("stopping every rank ...", file=sys.stderr)
        code = launch.stop()
        checkpoints = sorted((run_dir / CHECKPOINTS_DIR).glob("checkpoint-*"), key=lambda p: p.stat().st_mtime)
        where = f"last checkpoint: {checkpoints[-1]}" if checkpoints else "no checkpoint was saved"
        print(f"stopped; {where}. Continue with: tuner run {run_dir / 'recipe.lock.yaml'} --resume", file=sys.stderr)
        return code or 130
    if code != 0:
        for line in describe_failure(log_tail(launch.log_path), code):
            print(line, file=sys.stderr)
        print(f"full log: {launch.log_path}", file=sys.stderr)
    return code


def log_tail(path: Path, size: int = 256 * 1024) -> list[str]:
    """The end of a log, enough for torchrun's failure summary and the lines before it."""
    with open(path, "rb") as stream:
        stream.seek(max(0, path.stat().st_size - size))
        return stream.read().decode("utf-8", errors="replace").splitlines()
