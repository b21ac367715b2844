"""The checkpoint writer's half: after the Trainer saves a checkpoint, tuner adds the lock recipe and the settings
file that marks it complete (read back by :mod:`tuner.rundir.checkpoints`)."""
from __future__ import annotations

import json
from pathlib import Path

from transformers import TrainerCallback

from tuner.fileio import atomic_write_text, umask_permissions
from tuner.launch.integrity import file_digests
from tuner.recipe.schema import Recipe
from tuner.rundir.checkpoints import resume_settings
from tuner.rundir.layout import CHECKPOINT_INFO, CHECKPOINT_PREFIX, LOCK_FILE
from tuner.train.supervision import supervisor_alive


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
        info = {"step": state.global_step, "settings": resume_settings(self.recipe, args.world_size),
                "files": file_digests(checkpoint)}
        if not supervisor_alive():  # saved after the tuner run died: left incomplete, never resumed from
            return
        atomic_write_text(checkpoint / CHECKPOINT_INFO, json.dumps(info, indent=2) + "\n")
