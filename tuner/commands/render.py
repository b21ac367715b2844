"""``tuner render RECIPE [-o DIR]``: write the run directory without launching."""
from __future__ import annotations

from tuner.commands._recipe_args import add_recipe_arguments, recipe_from_args


def register(subparsers) -> None:
    parser = subparsers.add_parser("render", help="write the run directory (configs, launch.sh) without launching")
    add_recipe_arguments(parser)
    parser.add_argument("-o", "--output", help="run directory (default: the recipe's output.dir)")
    parser.add_argument("--force", action="store_true", help="overwrite files in an existing run directory")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tuner.render.launch_script import node_commands
    from tuner.render.run_directory import write_run_directory

    recipe = recipe_from_args(args)
    run_dir = write_run_directory(recipe, args.output, force=args.force)
    for path in sorted(run_dir.iterdir()):
        if path.is_file():
            print(path)
    commands = node_commands(recipe, run_dir)
    if len(commands) > 1:
        print(f"start on each of the {len(commands)} machines:")
        for rank, command in enumerate(commands):
            print(f"  machine {rank}: {command}")
    return 0
