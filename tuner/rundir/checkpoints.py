"""A run's checkpoints by name and by the settings a resume must share, read without torch; whether one is
complete and resumable is judged from its files (:mod:`tuner.rundir.integrity`).  One scan decides for the Ctrl-C
message, ``--resume``, the wizard and the training entrypoint alike.

The Trainer writes each ``checkpoint-N`` (weights or adapter, optimizer, scheduler, RNG, trainer state, tokenizer);
then tuner's callback adds the lock recipe and ``tuner_checkpoint.json`` with the settings a resume must share.
That file is written last, so it also marks the checkpoint complete: a run killed while saving leaves a folder
without it, and ``resume: auto`` skips that folder.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterator

from tuner.fileio import user_path
from tuner.rundir.integrity import checkpoint_problem, read_json
from tuner.rundir.layout import CHECKPOINT_INFO, CHECKPOINT_PREFIX, CHECKPOINTS_DIR

log = logging.getLogger("tuner")

_CHECKPOINT_NAME = re.compile(rf"^{re.escape(CHECKPOINT_PREFIX)}(\d+)$")


class CheckpointRefused(Exception):
    """A checkpoint the recipe cannot resume from; ``lines`` name the recipe field to change (the launcher and the
    ranks report it as a recipe error: this floor sits below tuner.recipe)."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


# settings added after checkpoints were first written, with the value every older checkpoint was saved under
SAVED_BEFORE = {"objective.kind": "sft", "parallelism.tp": 1, "parallelism.sp": 1, "parallelism.cp": 1,
                "parallelism.ep": 1}


def resume_settings(recipe: Recipe, world_size: int) -> dict[str, Any]:
    """The settings a checkpoint's optimizer and RNG state depend on, keyed by the recipe field to change.  The
    recipe is read by attribute: this floor sits below tuner.recipe."""
    mem, method = recipe.memory, recipe.method
    settings: dict[str, Any] = {
        "objective.kind": recipe.objective.kind,
        "hardware.num_processes": world_size,
        "memory.distributed": mem.distributed,
        "memory.zero_stage": mem.zero_stage,
        "memory.fsdp.sharding_strategy": mem.fsdp.sharding_strategy if mem.distributed == "fsdp" else None,
        "method.kind": method.kind,
        # each rank's optimizer and weight slices follow the model-parallel split
        "parallelism.tp": recipe.parallelism.tp,
        "parallelism.sp": recipe.parallelism.sp,
        "parallelism.cp": recipe.parallelism.cp,
        "parallelism.ep": recipe.parallelism.ep,  # which experts each rank's optimizer state holds
    }
    if method.kind != "full":
        lora = method.lora
        settings.update({
            "method.lora.r": lora.r,
            "method.lora.alpha": lora.alpha,
            "method.lora.dropout": lora.dropout,
            "method.lora.target_modules": lora.target_modules,
            "method.lora.modules_to_save": lora.modules_to_save,
        })
    settings["method.quantization"] = method.quantization.model_dump() if method.quantization else None
    return settings


def checkpoints_newest_first(directory: Path) -> list[Path]:
    found = [(int(m.group(1)), path) for path in directory.glob(f"{CHECKPOINT_PREFIX}*")
             if path.is_dir() and (m := _CHECKPOINT_NAME.match(path.name))]
    return [path for _, path in sorted(found, reverse=True)]


def incomplete_reason(checkpoint: Path, verify: bool = False) -> str | None:
    """Why a checkpoint cannot be resumed from (None: it can): no marker, or a file cut short after it (``verify``:
    or any byte damaged that a recorded digest or a zip CRC shows)."""
    if not (checkpoint / CHECKPOINT_INFO).is_file():
        return f"incomplete, no {CHECKPOINT_INFO} (the run stopped while saving it)"
    return checkpoint_problem(checkpoint, verify)


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
    """Raise CheckpointRefused naming every setting that differs from the one the checkpoint was saved with."""
    info_path = checkpoint / CHECKPOINT_INFO
    if not info_path.is_file():
        log.warning("%s has no %s (not saved by tuner); cannot check that its settings match", checkpoint, CHECKPOINT_INFO)
        return
    data, problem = read_json(info_path)
    saved = data.get("settings") if isinstance(data, dict) else None
    if problem or not isinstance(saved, dict):
        raise CheckpointRefused([f"training.resume: {info_path}: {problem or 'has no settings map (damaged)'}; give another "
                           "checkpoint, or use auto (which skips damaged ones)."])
    current = resume_settings(recipe, world_size)
    saved = {**SAVED_BEFORE, **saved}
    changed = [f"  {field}: saved with {saved.get(field)!r}, the recipe now has {value!r}"
               for field, value in current.items() if saved.get(field) != value]
    if changed:
        raise CheckpointRefused([
            f"training.resume: cannot resume from {checkpoint}: it was saved under different settings:",
            *changed,
            "Its optimizer, RNG and sharded states only fit the settings they were saved with. Restore those settings "
            "to resume, or start fresh with training.resume: never (and a new output.dir to keep this run).",
        ])


def resume_checkpoint(recipe: Recipe, run_dir: Path, world_size: int, verify: bool = False) -> Path | None:
    """The checkpoint to resume from (checked against the recipe), or None to start fresh; ``verify`` reads every
    byte of the one named explicitly."""
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
            raise CheckpointRefused([f"training.resume: {resume}: not a complete checkpoint folder (no trainer_state.json); "
                               "give a checkpoints/checkpoint-N folder, or use auto."])
        damaged = checkpoint_problem(checkpoint, verify)
        if damaged:
            raise CheckpointRefused([f"training.resume: {resume}: {damaged}; give an earlier checkpoint, or use auto "
                               "(which skips damaged ones)."])
    check_resumable(recipe, checkpoint, world_size)
    log.info("resuming from %s", checkpoint)
    return checkpoint
