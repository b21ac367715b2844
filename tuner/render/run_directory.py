"""A run directory: every file a launch needs, rendered from one recipe and written atomically."""
from __future__ import annotations

import os
from fnmatch import fnmatch
from pathlib import Path

from tuner.fileio import DestinationRefused, atomic_write_directory, atomic_write_text, check_destination, replace_files
from tuner.recipe.io import recipe_to_yaml, with_output_dir
from tuner.recipe.schema import Recipe
from tuner.recipe.source import RecipeError
from tuner.render.accelerate_config import render_accelerate_config
from tuner.render.deepspeed_config import render_deepspeed_config
from tuner.render.launch_script import has_slurm_script, render_launch_script, render_slurm_script
from tuner.rundir.layout import (
    ACCELERATE_CONFIG,
    CHECKPOINTS_DIR,
    DEEPSPEED_CONFIG,
    EVENTS_FILE,
    LAUNCH_SCRIPT,
    LOCK_FILE,
    LOG_FILE,
    MANIFEST,
    MODEL_SNAPSHOT,
    PREVIOUS_RUNS_DIR,
    PROBE_DIR,
    PROBE_REPORT,
    PROBE_REQUEST,
    RENDERED_FILES,
    RUN_OUTPUTS,
    SLURM_LOG,
    SLURM_SCRIPT,
)
from tuner.rundir.lock import RunLock, RunLocked
from tuner.rundir.manifest import check_owned, manifest_text, proved, run_output, text_record

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


def check_run_directory(run_dir: str | Path) -> None:
    """Refuse, in every mode (a new run, ``--force``, ``--resume``, ``--dry-run``), a destination tuner may not write a
    run into: a symbolic link, a file, the current folder or one above it, and a folder holding anything its manifest
    does not prove tuner wrote, besides what a run adds (:func:`~tuner.rundir.manifest.run_output`).  A RecipeError,
    which no override passes."""
    try:
        check_destination(Path(run_dir))
        check_owned(Path(run_dir), kept=run_output)
    except DestinationRefused as exc:
        raise RecipeError([str(exc)]) from None


def holds_only_rendered_files(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds only rendered files its manifest proves (what ``tuner run --dry-run`` leaves) and what
    ``tuner probe`` left (its ``probe/`` folder; in a probe's own directory, the probe's events, log and report): no
    run has started there, so a launch may replace the rendered files without --force."""
    run_dir = Path(run_dir)
    if run_dir.is_symlink() or not run_dir.is_dir():
        return False
    names = [entry.name for entry in run_dir.iterdir()]
    rendered = [name for name in proved(run_dir) if name in RENDERED_FILES]
    left = PROBE_LEFT if PROBE_REQUEST in names else (PROBE_DIR,)
    return bool(names) and all(name in rendered or name == MANIFEST or name in left for name in names)


def earlier_run_outputs(run_dir: str | Path) -> list[str]:
    """The names of what a run has written into ``run_dir`` (events, log, checkpoints, final model, Slurm logs ...);
    not ``probe/``, a run directory of its own that each probe replaces (``tuner run --probe`` probes just before the
    run it measured for)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(entry.name for entry in run_dir.iterdir() if entry.name != PROBE_DIR and (
        entry.name in RUN_OUTPUTS or fnmatch(entry.name, SLURM_LOG.replace("%j", "*"))))


def move_earlier_run_aside(run_dir: str | Path) -> Path:
    """Move an earlier run's outputs, with a copy of the lock recipe they were made under, into a new
    ``previous/N/`` of the run directory (renames: nothing is copied but the lock, nothing deleted).  The caller
    holds the run's lock."""
    run_dir = Path(run_dir)
    previous = run_dir / PREVIOUS_RUNS_DIR
    previous.mkdir(exist_ok=True)
    taken = [int(entry.name) for entry in previous.iterdir() if entry.name.isdigit()]
    number = max(taken, default=0) + 1
    while True:
        aside = previous / str(number)
        try:
            aside.mkdir()
            break
        except FileExistsError:
            number += 1
    if (run_dir / LOCK_FILE).is_file():
        atomic_write_text(aside / LOCK_FILE, (run_dir / LOCK_FILE).read_text(encoding="utf-8"))
    for name in earlier_run_outputs(run_dir):
        os.rename(run_dir / name, aside / name)
    return aside


def with_manifest(files: dict[str, str], kept: dict[str, dict]) -> dict[str, str]:
    """``files`` and, last (so it is renamed into place after them), the manifest recording them beside ``kept``."""
    records = {**kept, **{name: text_record(text) for name, text in files.items()}}
    return {**files, MANIFEST: manifest_text(records, "tuner render")}


def write_run_directory(recipe: Recipe, run_dir: str | Path | None = None, *, force: bool = False,
                        keep_existing: bool = False) -> Path:
    """Write the run files into a new directory, or (``force``, or ``keep_existing`` to resume) replace the rendered
    files of an existing one, keeping everything the run has written (events, log, checkpoints, final model).

    Holds the run's lock while it writes (a tuner that trains there is never rewritten under it); refused before
    anything is written: a symbolic link, the current folder or one above it, and a folder holding files tuner did
    not write."""
    if run_dir is not None:
        recipe = with_output_dir(recipe, run_dir)  # checked like any recipe value (no control characters)
    run_dir = Path(recipe.output.dir)
    check_run_directory(run_dir)
    existing = run_dir.is_dir() and any(run_dir.iterdir())
    if existing and not (force or keep_existing):
        raise RecipeError([f"{run_dir}: the run directory already exists; pass --force to replace its rendered files "
                           "(its events, log and checkpoints are kept), --resume to continue it, or change output.dir."])
    files = render_run_files(recipe)
    modes = {name: 0o755 for name in EXECUTABLES}
    try:
        with RunLock(run_dir):
            check_run_directory(run_dir)  # again, now that no other tuner can change it
            if not existing:  # whole or not at all, its manifest with it: a full disk leaves no half run
                return atomic_write_directory(run_dir, with_manifest(files, {}), modes)
            # files rendered before and not now (a DeepSpeed config after a change of topology) go too: each is
            # proved tuner's by now, and the other files the manifest proves (the model snapshot) stay listed
            gone = [name for name in RENDERED_FILES if name not in files]
            kept = {name: record for name, record in proved(run_dir).items() if name not in RENDERED_FILES}
            return replace_files(run_dir, with_manifest(files, kept), modes, remove=gone)
    except RunLocked as exc:
        raise RecipeError([str(exc)]) from None
