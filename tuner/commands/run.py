"""``tuner run RECIPE [--set k=v] [--dry-run] [--force] [--resume]``: validate, render, launch, follow."""
from __future__ import annotations

from tuner.commands._recipe_args import add_recipe_arguments, recipe_from_args
from tuner.launch.argv import launch_argv, shell_command
from tuner.launch.session import launch_and_follow
from tuner.render.run_directory import write_run_directory


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="render the run directory and launch training")
    add_recipe_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="write and print the files and the command; run nothing")
    parser.add_argument("--force", action="store_true", help="overwrite an existing run directory's files")
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    parser.set_defaults(run=run)


def run(args) -> int:
    if args.resume:
        args.overrides.append("training.resume=auto")
    recipe = recipe_from_args(args)
    run_dir = write_run_directory(recipe, force=args.force, keep_existing=args.resume)
    argv = launch_argv(run_dir)
    if args.dry_run:
        for path in sorted(run_dir.iterdir()):
            if path.is_file():
                print(f"==> {path} <==\n{path.read_text()}")
        print(shell_command(argv))
        return 0
    print(f"launching: {shell_command(argv)}")
    return launch_and_follow(run_dir)
