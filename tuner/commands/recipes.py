"""``tuner recipes ls | show NAME | cp NAME DEST [--force] | check [--write]``: the built-in recipes.

``ls`` groups them by family (the demos first) and method, with the hardware each needs. ``check`` validates, builds
and plans every one: its model must build as training builds it (real class, attention, quantised layers, adapters,
on the meta device: :func:`tuner.loading.model.build_on_meta`), it must fit its stated hardware, and each GPU recipe's ``# Predicted peak:`` comment must say what
the planner says now; ``check --write`` (``make recipe-peaks``) rewrites those comments after a planner change.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.reason import library_words

if TYPE_CHECKING:
    from tuner.recipe.schema import Recipe

PEAK_LINE = re.compile(r"^# Predicted peak:.*$", re.MULTILINE)
METHOD_ORDER = ("full", "lora", "qlora")
EXIT_CHECK_FAILED = 1


def register(subparsers) -> None:
    parser = subparsers.add_parser("recipes", help="list, show, copy or check the built-in recipes")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("ls", help="list built-in recipes by family and method, with the hardware each needs"
                       ).set_defaults(run=run_ls)
    show = actions.add_parser("show", help="print a built-in recipe")
    show.add_argument("name")
    show.set_defaults(run=run_show)
    copy = actions.add_parser("cp", help="copy a built-in recipe to a file you can edit")
    copy.add_argument("name")
    copy.add_argument("dest", help="destination file (or directory)")
    copy.add_argument("--force", action="store_true", help="overwrite an existing destination")
    copy.set_defaults(run=run_cp)
    check = actions.add_parser("check", help="validate and plan every built-in recipe against its stated peak")
    check.add_argument("--write", action="store_true", help="rewrite the '# Predicted peak:' comments from the plan")
    check.set_defaults(run=run_check)


def hardware_needed(recipe: Recipe) -> str:
    hardware = recipe.hardware
    if not recipe.uses_gpu:
        return "CPU"
    gpus = f"{hardware.gpus_per_machine} x {hardware.gpu or f'{hardware.gpu_memory_gb:g}GB'}"
    return gpus if hardware.machines == 1 else f"{hardware.machines} machines x {gpus}"


def _size(name: str) -> float:
    match = re.match(r"(\d+(?:\.\d+)?)", name.split("/")[-1])
    return float(match.group(1)) if match else 0.0


def run_ls(args) -> int:
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import DEMO_FAMILY, builtin_names, builtin_path, describe, family
    from tuner.recipe.source import RecipeError

    rows = []
    for name in builtin_names():
        try:
            recipe = load_recipe(builtin_path(name))
            method, hardware = recipe.method.kind, hardware_needed(recipe)
        except RecipeError as exc:
            method, hardware = "?", f"invalid: {library_words(exc)}"
        rows.append((family(name), method, name, hardware))
    families = [DEMO_FAMILY] + sorted({row[0] for row in rows} - {DEMO_FAMILY})
    width = max((len(row[2]) for row in rows), default=0)
    hardware_width = max((len(row[3]) for row in rows), default=0)
    for group in families:
        members = sorted((row for row in rows if row[0] == group),
                         key=lambda row: (METHOD_ORDER.index(row[1]) if row[1] in METHOD_ORDER else 9, _size(row[2]),
                                          row[2]))
        if not members:
            continue
        print(group)
        for _, method, name, hardware in members:
            print(f"  {method:<6} {name:<{width}}  {hardware:<{hardware_width}}  {describe(name)}")
    return 0


def run_show(args) -> int:
    from tuner.recipe.io import read_recipe_text
    from tuner.recipe.registry import builtin_path

    print(read_recipe_text(builtin_path(args.name)), end="")
    return 0


def run_cp(args) -> int:
    import os

    from tuner.fileio import DIRECTORY, FILE, LINK, atomic_write_text, entry_kind
    from tuner.recipe.io import read_recipe_text
    from tuner.recipe.registry import builtin_path
    from tuner.recipe.source import RecipeError

    source = builtin_path(args.name)
    dest = Path(args.dest)
    if dest.is_dir() and not dest.is_symlink():
        dest = dest / source.name
    if os.path.lexists(dest):
        kind = entry_kind(dest)
        if kind == LINK:
            raise RecipeError([f"{dest}: is a symbolic link (to {os.readlink(dest)}); give the file itself, or another."])
        if kind != FILE:
            raise RecipeError([f"{dest}: is {'a folder' if kind == DIRECTORY else kind}, not a recipe file; choose "
                               "another destination."])
        if not args.force:
            raise RecipeError([f"{dest}: already exists; pass --force to overwrite it."])
    atomic_write_text(dest, read_recipe_text(source))
    print(f"copied {args.name} to {dest}")
    return 0


def peak_line(memory_plan) -> str:
    """The comment a GPU recipe states its predicted peak in (what `tuner plan` prints, rounded)."""
    device = memory_plan.gpu
    host = f", {memory_plan.host_ram_gib:.0f} GiB host RAM per machine" if memory_plan.host_ram_gib else ""
    return (f"# Predicted peak: {device.total_gib:.1f} of {device.capacity_gib:.1f} GiB per GPU{host}, "
            f"{memory_plan.verdict} (tuner plan; `make recipe-peaks` refreshes this line)")


def build_problem(recipe: Recipe) -> str | None:
    """What transformers, bitsandbytes or PEFT raise when ``recipe``'s model is built with tuner's loader on the
    meta device (None: it builds): the net under ``tuner validate``'s own rules."""
    from tuner.loading.model import build_on_meta

    try:
        build_on_meta(recipe)
    except Exception as exc:  # any refusal of the libraries is the finding; the message says which
        return f"{type(exc).__name__}: {library_words(exc, 1000)}"
    return None


def check_recipe(name: str, write: bool) -> str | None:
    """Why a built-in recipe fails the check (None when it passes); with ``write``, fix a stale peak comment."""
    from tuner.fileio import atomic_write_text
    from tuner.planner import plan
    from tuner.recipe.io import load_recipe, read_recipe_text
    from tuner.recipe.registry import builtin_path, planned_as
    from tuner.recipe.source import RecipeError

    path = builtin_path(name)
    try:
        recipe = load_recipe(path)
    except RecipeError as exc:
        return str(exc)
    planned = planned_as(recipe)  # demo-dpo starts from demo's result: built and planned on demo's model
    problem = build_problem(planned)
    if problem:
        return f"{path}: validates, but its model does not build as training builds it: {problem}"
    memory_plan = plan(planned)
    if memory_plan.verdict != "fits":
        return (f"{path}: plans to '{memory_plan.verdict}' on {hardware_needed(recipe)} "
                f"({memory_plan.gpu.total_gib:.1f} GiB of {memory_plan.gpu.capacity_gib or 0:.1f} GiB); a built-in "
                "recipe must fit its hardware with room to spare: change its tactics (tuner plan --advise).")
    if not recipe.uses_gpu:
        return None
    text = read_recipe_text(path)
    stated, wanted = PEAK_LINE.search(text), peak_line(memory_plan)
    if stated is None:
        return f"{path}: states no predicted peak; add a '# Predicted peak:' comment line and run `make recipe-peaks`."
    if stated.group(0) == wanted:
        return None
    if write:
        atomic_write_text(path, text[:stated.start()] + wanted + text[stated.end():])
        print(f"updated {name}: {wanted}")
        return None
    return (f"{path}: the comment says\n  {stated.group(0)}\nbut the plan now says\n  {wanted}\n"
            "run `make recipe-peaks` (tuner recipes check --write) to refresh the comments.")


def run_check(args) -> int:
    from tuner.recipe.registry import builtin_names

    problems = [problem for name in builtin_names() if (problem := check_recipe(name, args.write))]
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"{len(builtin_names()) - len(problems)} of {len(builtin_names())} built-in recipes validate, build, fit and "
          "state their predicted peak")
    return EXIT_CHECK_FAILED if problems else 0
