"""A run directory: every file a launch needs, rendered from one recipe and written atomically."""
from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

from tuner.fileio import DestinationRefused, atomic_write_directory, check_destination, replace_files
from tuner.recipe.io import RecipeError, recipe_to_yaml, with_output_dir
from tuner.recipe.schema import Recipe
from tuner.render.accelerate_config import render_accelerate_config
from tuner.render.deepspeed_config import render_deepspeed_config
from tuner.render.launch_script import has_slurm_script, render_launch_script, render_slurm_script
from tuner.run_layout import (
    ACCELERATE_CONFIG,
    CHECKPOINTS_DIR,
    DEEPSPEED_CONFIG,
    EVENTS_FILE,
    LAUNCH_SCRIPT,
    LOCK_FILE,
    LOG_FILE,
    MODEL_SNAPSHOT,
    PROBE_DIR,
    PROBE_REPORT,
    PROBE_REQUEST,
    RENDERED_FILES,
    RUN_OUTPUTS,
    SLURM_LOG,
    SLURM_SCRIPT,
)

EXECUTABLES = (LAUNCH_SCRIPT, SLURM_SCRIPT)
# What a probe leaves in its own run directory (its checkpoint, when a kill kept the probe from removing it)
PROBE_LEFT = (PROBE_REQUEST, PROBE_REPORT, EVENTS_FILE, LOG_FILE, MODEL_SNAPSHOT, CHECKPOINTS_DIR)


def render_run_files(recipe: Recipe, run_dir: str | Path | None = None) -> dict[str, str]:
    """File name -> text for the run directory (what the Review screen shows and ``tuner render`` writes)."""
    if run_dir is not None:  # the lock names the directory the files are written to (`tuner render -o DIR`)
        recipe = with_output_dir(recipe, run_dir)
    run_dir = Path(recipe.output.dir)
    mem = recipe.memory
    deepspeed_file = str(run_dir / DEEPSPEED_CONFIG) if mem.distributed == "deepspeed" else None
    layer_classes = None
    if mem.distributed == "fsdp":
        from tuner.render.model_layers import decoder_layer_classes

        layer_classes = decoder_layer_classes(recipe.model)
    files = {
        LOCK_FILE: recipe_to_yaml(recipe),
        ACCELERATE_CONFIG: render_accelerate_config(recipe, deepspeed_file, layer_classes),
    }
    if deepspeed_file:
        files[DEEPSPEED_CONFIG] = render_deepspeed_config(recipe)
    files[LAUNCH_SCRIPT] = render_launch_script(recipe, run_dir)
    if has_slurm_script(recipe):
        files[SLURM_SCRIPT] = render_slurm_script(recipe, run_dir)
    return files


def _own_entry(name: str) -> bool:
    """A name tuner puts in a run directory: a rendered file, a run output, a Slurm log, or a temporary file of
    tuner's own that a kill left behind (``.recipe.lock.yaml.x1y2.tmp``)."""
    if name in RENDERED_FILES or name in RUN_OUTPUTS or fnmatch(name, SLURM_LOG.replace("%j", "*")):
        return True
    return name.endswith(".tmp") and any(name.startswith(f".{own}.") for own in (*RENDERED_FILES, *RUN_OUTPUTS))


def check_run_directory(run_dir: str | Path, *, keep_existing: bool = False) -> None:
    """Refuse a destination tuner may not write a run into: a symbolic link, the current folder or one above it,
    and (unless resuming, ``keep_existing``) a folder holding files tuner did not write.  A RecipeError, which no
    override passes."""
    try:
        check_destination(Path(run_dir), owned=None if keep_existing else _own_entry)
    except DestinationRefused as exc:
        raise RecipeError([str(exc)]) from None


def holds_only_rendered_files(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds only files `tuner render` writes (what ``tuner run --dry-run`` leaves) and what
    ``tuner probe`` left (its ``probe/`` folder; in a probe's own directory, the probe's events, log and report): no
    run has started there, so a launch may replace the rendered files without --force."""
    run_dir = Path(run_dir)
    if run_dir.is_symlink() or not run_dir.is_dir():
        return False
    names = [entry.name for entry in run_dir.iterdir()]
    left = PROBE_LEFT if PROBE_REQUEST in names else (PROBE_DIR,)
    return bool(names) and all(name in RENDERED_FILES or name in left for name in names)


def write_run_directory(recipe: Recipe, run_dir: str | Path | None = None, *, force: bool = False,
                        keep_existing: bool = False) -> Path:
    """Write the run files into a new directory, or (``force``, or ``keep_existing`` to resume) replace the rendered
    files of an existing one, keeping everything the run has written (events, log, checkpoints, final model).

    Refused before anything is written: a symbolic link, the current folder or one above it, and (unless
    resuming) a folder holding files tuner did not write."""
    if run_dir is not None:
        recipe = with_output_dir(recipe, run_dir)  # checked like any recipe value (no control characters)
    run_dir = Path(recipe.output.dir)
    check_run_directory(run_dir, keep_existing=keep_existing)
    existing = run_dir.is_dir() and any(run_dir.iterdir())
    if existing and not (force or keep_existing):
        raise RecipeError([f"{run_dir}: the run directory already exists; pass --force to replace its rendered files "
                           "(its events, log and checkpoints are kept), --resume to continue it, or change output.dir."])
    files = render_run_files(recipe)
    modes = {name: 0o755 for name in EXECUTABLES}
    if not existing:
        return atomic_write_directory(run_dir, files, modes)  # whole or not at all: a full disk leaves no half run
    # files rendered before and not now (a DeepSpeed config after a change of topology) go too
    return replace_files(run_dir, files, modes, remove=[name for name in RENDERED_FILES if name not in files])
