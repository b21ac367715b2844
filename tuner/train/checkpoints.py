"""The checkpoint writer's half: after the Trainer saves a checkpoint, tuner adds the lock recipe and the settings
file that marks it complete, with each file's size once its header or directory reads (read back by
:mod:`tuner.rundir.checkpoints`)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from transformers import TrainerCallback

from tuner.fileio import atomic_write_text, umask_permissions
from tuner.rundir.integrity import saved_files
from tuner.recipe.schema import Recipe
from tuner.rundir.checkpoints import resume_settings
from tuner.rundir.layout import CHECKPOINT_INFO, CHECKPOINT_PREFIX, LOCK_FILE
from tuner.train.supervision import supervisor_alive

log = logging.getLogger("tuner")


class CheckpointInfoCallback(TrainerCallback):
    """After the Trainer saves a checkpoint, add the lock recipe and the settings file (rank 0)."""

    def __init__(self, recipe: Recipe, lock_text: str):
        self.recipe = recipe
        self.lock_text = lock_text

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        checkpoint = Path(args.output_dir) / f"{CHECKPOINT_PREFIX}{state.global_step}"
        umask_permissions(checkpoint)  # safetensors leaves its files 0600
        atomic_write_text(checkpoint / LOCK_FILE, self.lock_text)
        files, problem = saved_files(checkpoint)  # sizes and headers only: the other ranks wait in a collective
        if problem:  # never marked complete: a resume skips it
            log.warning("%s was saved damaged (%s); it will not be resumed from", checkpoint, problem)
            return
        info = {"step": state.global_step, "settings": resume_settings(self.recipe, args.world_size), "files": files}
        if not supervisor_alive():  # saved after the tuner run died: left incomplete, never resumed from
            return
        atomic_write_text(checkpoint / CHECKPOINT_INFO, json.dumps(info, indent=2) + "\n")
