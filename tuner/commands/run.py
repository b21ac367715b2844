"""``tuner run RECIPE [--set k=v] [--dry-run] [--force] [--resume]``: validate, check memory, render, launch, follow."""
from __future__ import annotations

import sys

from tuner.commands._recipe_args import add_recipe_arguments, recipe_from_args
from tuner.doctor import check_disk, require_trackers
from tuner.launch.preflight import check_memory
from tuner.launch.session import launch_and_follow
from tuner.recipe.io import RecipeError
from tuner.render.launch_command import launch_argv, shell_command
from tuner.render.launch_script import node_commands
from tuner.render.run_directory import write_run_directory
from tuner.run_layout import LAUNCH_SCRIPT, SLURM_SCRIPT


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="render the run directory and launch training")
    add_recipe_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="write and print the files and the command; run nothing")
    parser.add_argument("--force", action="store_true",
                        help="overwrite an existing run directory's files; launch even if the plan does not fit")
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    parser.set_defaults(run=run)


def run(args) -> int:
    if args.resume:
        args.overrides.append("training.resume=auto")
    recipe = recipe_from_args(args)
    memory = check_memory(recipe)
    if memory.refused and not args.force:
        raise RecipeError([memory.message, "pass --force to launch anyway."])
    if memory.message:
        print(("launching anyway (--force): " if memory.refused else "") + memory.message, file=sys.stderr)
    disk = check_disk(recipe)  # a full or read-only disk found now, not at the first checkpoint hours in
    if disk.status == "fail":
        if not args.force:
            raise RecipeError([f"output.dir: {disk.detail}.", f"{disk.fix}; or pass --force to launch anyway."])
        print(f"launching anyway (--force): {disk.detail}", file=sys.stderr)
    require_trackers(recipe)  # a tracker training.report_to names must be installed: said now, not by every rank
    run_dir = write_run_directory(recipe, force=args.force, keep_existing=args.resume)
    commands = node_commands(recipe, run_dir)
    if args.dry_run:
        for path in sorted(run_dir.iterdir()):
            if path.is_file():
                print(f"==> {path} <==\n{path.read_text()}")
        print("\n".join(commands))
        return 0
    if len(commands) > 1:
        lines = [f"{run_dir}: a run on {len(commands)} machines starts on each of them; run on machine N "
                 f"`{run_dir / LAUNCH_SCRIPT} N`, or submit `sbatch {run_dir / SLURM_SCRIPT}` on a Slurm cluster:"]
        raise RecipeError(lines + [f"  machine {rank}: {command}" for rank, command in enumerate(commands)])
    if args.resume:
        report_resume(run_dir)
    print(f"launching: {shell_command(launch_argv(run_dir))}")
    return launch_and_follow(run_dir)


def report_resume(run_dir) -> None:
    """Say which checkpoint the ranks will resume from, and why newer ones are skipped, before they start."""
    from tuner.run_layout import CHECKPOINTS_DIR
    from tuner.train.checkpoints import checkpoint_states

    for checkpoint, problem in checkpoint_states(run_dir / CHECKPOINTS_DIR):
        if problem is None:
            print(f"resuming from {checkpoint}", file=sys.stderr)
            return
        print(f"skipping {checkpoint}: {problem}", file=sys.stderr)
    print(f"no complete checkpoint in {run_dir / CHECKPOINTS_DIR}: starting from the beginning", file=sys.stderr)
