"""``tuner run RECIPE [--set k=v] [--dry-run] [--force] [--resume [--verify]] [--probe]``: check, render, launch,
follow, summarise (``--probe``: measure the recipe with ``tuner probe`` first)."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tuner.commands._recipe_args import add_recipe_arguments, recipe_from_args

if TYPE_CHECKING:
    from tuner.launch.run import PreparedRun, RunOutcome

FORCE_HINT = "pass --force to launch anyway."


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="check the plan, render the run directory, launch and follow training")
    add_recipe_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="write and print the files and the command; run nothing")
    parser.add_argument("--force", action="store_true",
                        help="launch even if the plan does not fit or the disk is small; replace tuner's files in an "
                             "existing run directory")
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    parser.add_argument("--verify", action="store_true",
                        help="with --resume: read every byte of the checkpoint first (its recorded SHA-256, zip CRCs); "
                             "without it sizes, headers and zip directories are checked")
    parser.add_argument("--probe", action="store_true",
                        help="first probe the recipe on this machine (tuner probe: a few steps on worst-case batches, "
                             "measured beside the plan) and launch only if the probe ran")
    parser.set_defaults(run=run)


def prepare_or_refuse(recipe, **options) -> PreparedRun:
    """:func:`prepare_run`, its refusal ending with the command line's override and its notes on stderr."""
    from tuner.launch.run import RunRefused, prepare_run
    from tuner.recipe.source import RecipeError

    try:
        prepared = prepare_run(recipe, **options)
    except RunRefused as exc:
        raise RecipeError([*exc.lines, FORCE_HINT]) from None
    for note in prepared.notes:
        print(note, file=sys.stderr)
    return prepared


def launch_and_report(prepared: PreparedRun) -> RunOutcome:
    """Follow the run with a progress bar and print how it ended (the summary on stdout, anything else on stderr)."""
    from tuner.launch.progress import ProgressView
    from tuner.launch.run import follow_run
    from tuner.recipe.source import RecipeError

    if not prepared.launchable:
        raise RecipeError(prepared.machine_lines())
    print(f"launching: {prepared.command}")
    view = ProgressView()
    with view:
        outcome = follow_run(prepared, on_update=lambda events, _lines: view.update(events))
    print("\n".join(outcome.lines), file=sys.stdout if outcome.status == "finished" else sys.stderr)
    return outcome


def check_resumed_lock(args, recipe) -> None:
    """A run's lock recipe names the run it belongs to: resuming it continues that run, never the one in whatever
    folder its output.dir names (a copied or edited lock), unless a --set output.dir says so."""
    from pathlib import Path

    from tuner.recipe.registry import resolve_recipe_argument
    from tuner.recipe.source import RecipeError
    from tuner.rundir.layout import CHECKPOINTS_DIR, FINAL_DIR, LOCK_FILE, MERGED_DIR

    lock = resolve_recipe_argument(args.recipe)
    chosen = any(override.split("=", 1)[0].strip() == "output.dir" for override in args.overrides)
    if lock.name != LOCK_FILE or chosen:
        return
    run_dir = lock.parent  # the run's own lock, or the copy in its final/, merged/ or checkpoints/checkpoint-N/
    if run_dir.name in (FINAL_DIR, MERGED_DIR):
        run_dir = run_dir.parent
    elif run_dir.parent.name == CHECKPOINTS_DIR:
        run_dir = run_dir.parent.parent
    if Path(recipe.output.dir).resolve() != run_dir.resolve():
        raise RecipeError([f"output.dir: {recipe.output.dir} is not the run directory of {lock}; resuming continues "
                           f"the run this lock belongs to. Pass --set output.dir={run_dir} to resume it, or another "
                           "output.dir to start a new run from it without --resume."])


def run(args) -> int:
    if args.verify and not args.resume:
        from tuner.recipe.source import RecipeError

        raise RecipeError(["--verify checks the checkpoint a run resumes from: pass it with --resume."])
    recipe = recipe_from_args(args)
    if args.resume:
        check_resumed_lock(args, recipe)
    if args.probe:
        from tuner.commands.probe import probe_and_report
        from tuner.recipe.source import RecipeError

        if args.dry_run:
            raise RecipeError(["--probe launches the probe; a --dry-run launches nothing: choose one."])
        code = probe_and_report(recipe, steps=None, force=args.force)
        if code:
            return code
    prepared = prepare_or_refuse(recipe, force=args.force, resume=args.resume, verify=args.verify,
                                 dry_run=args.dry_run)
    if args.dry_run:
        from tuner.rundir.layout import RENDERED_FILES

        for path in sorted(prepared.run_dir.iterdir()):  # what it rendered, not a run's log or events of any size
            if path.name in RENDERED_FILES:
                print(f"==> {path} <==\n{path.read_text()}")
        print("\n".join(prepared.machine_commands))
        return 0
    return launch_and_report(prepared).exit_code
