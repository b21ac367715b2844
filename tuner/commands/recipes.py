"""``tuner recipes ls | show NAME | cp NAME DEST [--force]``: the built-in recipes."""
from __future__ import annotations

from pathlib import Path

from tuner.fileio import atomic_write_text
from tuner.recipe.io import RecipeError, read_recipe_text
from tuner.recipe.registry import builtin_names, builtin_path, describe


def register(subparsers) -> None:
    parser = subparsers.add_parser("recipes", help="list, show or copy the built-in recipes")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("ls", help="list built-in recipes").set_defaults(run=run_ls)
    show = actions.add_parser("show", help="print a built-in recipe")
    show.add_argument("name")
    show.set_defaults(run=run_show)
    copy = actions.add_parser("cp", help="copy a built-in recipe to a file you can edit")
    copy.add_argument("name")
    copy.add_argument("dest", help="destination file (or directory)")
    copy.add_argument("--force", action="store_true", help="overwrite an existing destination")
    copy.set_defaults(run=run_cp)


def run_ls(args) -> int:
    names = builtin_names()
    width = max(map(len, names), default=0)
    for name in names:
        print(f"{name:<{width}}  {describe(name)}")
    return 0


def run_show(args) -> int:
    print(read_recipe_text(builtin_path(args.name)), end="")
    return 0


def run_cp(args) -> int:
    source = builtin_path(args.name)
    dest = Path(args.dest)
    if dest.is_dir():
        dest = dest / source.name
    if dest.exists() and not args.force:
        raise RecipeError([f"{dest}: already exists; pass --force to overwrite it."])
    atomic_write_text(dest, read_recipe_text(source))
    print(f"copied {args.name} to {dest}")
    return 0
