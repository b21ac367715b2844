"""A run's checkpoints judged whole and resumable: the checks that read a checkpoint's files
(:mod:`tuner.launch.integrity`) on top of the names and settings in :mod:`tuner.rundir.checkpoints`."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

from tuner.fileio import user_path
from tuner.launch.integrity import checkpoint_problem, read_json
from tuner.recipe.io import RecipeError
from tuner.recipe.schema import Recipe
from tuner.rundir.checkpoints import SAVED_BEFORE, checkpoints_newest_first, resume_settings
from tuner.rundir.layout import CHECKPOINT_INFO, CHECKPOINTS_DIR

log = logging.getLogger("tuner")


def incomplete_reason(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be resumed from (None: it can): no marker, or a file cut short after it."""
    if not (checkpoint / CHECKPOINT_INFO).is_file():
        return f"incomplete, no {CHECKPOINT_INFO} (the run stopped while saving it)"
    return checkpoint_problem(checkpoint)


def checkpoint_states(directory: Path) -> Iterator[tuple[Path, str | None]]:
    """Each checkpoint, newest first, with why it cannot be resumed from (None when it can)."""
    for checkpoint in checkpoints_newest_first(directory):
        yield checkpoint, incomplete_reason(checkpoint)


def latest_complete_checkpoint(directory: Path) -> Path | None:
    """The newest checkpoint that was completely written; damaged or incomplete newer ones are logged and skipped."""
    for checkpoint, problem in checkpoint_states(directory):
        if problem is None:
            return checkpoint
        log.warning("skipping %s: %s", checkpoint, problem)
    return None


def check_resumable(recipe: Recipe, checkpoint: Path, world_size: int) -> None:
    """Raise RecipeError naming every setting that differs from the one the checkpoint was saved with."""
    info_path = checkpoint / CHECKPOINT_INFO
    if not info_path.is_file():
        log.warning("%s has no %s (not saved by tuner); cannot check that its settings match", checkpoint, CHECKPOINT_INFO)
        return
    data, problem = read_json(info_path)
    saved = data.get("settings") if isinstance(data, dict) else None
    if problem or not isinstance(saved, dict):
        raise RecipeError([f"training.resume: {info_path}: {problem or 'has no settings map (damaged)'}; give another "
                           "checkpoint, or use auto (which skips damaged ones)."])
    current = resume_settings(recipe, world_size)
    saved = {**SAVED_BEFORE, **saved}
    changed = [f"  {field}: saved with {saved.get(field)!r}, the recipe now has {value!r}"
               for field, value in current.items() if saved.get(field) != value]
    if changed:
        raise RecipeError([
            f"training.resume: cannot resume from {checkpoint}: it was saved under different settings:",
            *changed,
            "Its optimizer, RNG and sharded states only fit the settings they were saved with. Restore those settings "
            "to resume, or start fresh with training.resume: never (and a new output.dir to keep this run).",
        ])


def resume_checkpoint(recipe: Recipe, run_dir: Path, world_size: int) -> Path | None:
    """The checkpoint to resume from (checked against the recipe), or None to start fresh."""
    resume = recipe.training.resume
    if resume == "never":
        return None
    if resume == "auto":
        checkpoint = latest_complete_checkpoint(run_dir / CHECKPOINTS_DIR)
        if checkpoint is None:
            log.info("resume: auto found no complete checkpoint in %s; starting fresh", run_dir / CHECKPOINTS_DIR)
            return None
    else:
        checkpoint = user_path(resume)
        if not (checkpoint / "trainer_state.json").is_file():
            raise RecipeError([f"training.resume: {resume}: not a complete checkpoint folder (no trainer_state.json); "
                               "give a checkpoints/checkpoint-N folder, or use auto."])
        damaged = checkpoint_problem(checkpoint)
        if damaged:
            raise RecipeError([f"training.resume: {resume}: {damaged}; give an earlier checkpoint, or use auto "
                               "(which skips damaged ones)."])
    check_resumable(recipe, checkpoint, world_size)
    log.info("resuming from %s", checkpoint)
    return checkpoint
