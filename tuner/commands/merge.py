"""``tuner merge RUN [-o OUT] [--force]``: merge a run's LoRA adapter into its base model."""
from __future__ import annotations

import contextlib
from pathlib import Path

from tuner.rundir.library_output import VERBOSE_HELP


def register(subparsers) -> None:
    parser = subparsers.add_parser("merge", help="merge a LoRA/QLoRA run's adapter into its base model (standalone model)")
    parser.add_argument("run_dir", metavar="RUN", help="run directory (uses its final/ adapter) or a checkpoint folder holding an adapter")
    parser.add_argument("-o", "--output", help="where to save the merged model (default: RUN/merged)")
    parser.add_argument("--force", action="store_true",
                        help="replace a merged model tuner saved there before (never a folder holding other files)")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    parser.set_defaults(run=run)


def run(args) -> int:
    from tuner.loading.merge import find_adapter, merge_adapter, run_of
    from tuner.recipe.io import load_recipe
    from tuner.recipe.source import RecipeError
    from tuner.rundir.layout import LOCK_FILE, MERGED_DIR
    from tuner.rundir.library_output import libraries_to_log
    from tuner.rundir.lock import RunLock

    from tuner.loading.model import ModelLoadError
    from tuner.rundir.integrity import saved_model_problem

    run_dir = Path(args.run_dir)
    adapter = find_adapter(run_dir)
    damaged = saved_model_problem(adapter)
    if damaged:
        raise ModelLoadError(f"{adapter}/{damaged}; the adapter cannot be merged. Restore the file, or merge one of "
                             "the run's checkpoints/checkpoint-N.")
    run = run_of(adapter)
    lock = next((p for p in (adapter / LOCK_FILE, run_dir / LOCK_FILE, run / LOCK_FILE) if p.is_file()), None)
    if lock is None:
        raise RecipeError([f"{run_dir}: no {LOCK_FILE} beside the adapter; merge needs it to find the base model."])
    log_dir = run if (run / LOCK_FILE).is_file() else None  # a run's train.log; never into a folder not tuner's
    with RunLock(run) if run != adapter else contextlib.nullcontext(), libraries_to_log(log_dir, args.verbose):
        output = merge_adapter(load_recipe(lock), adapter, Path(args.output) if args.output else run / MERGED_DIR,
                               force=args.force)
    print(f"merged model saved in {output}")
    return 0
