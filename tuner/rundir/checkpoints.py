"""A run's checkpoints by name and by the settings a resume must share, read without torch; whether one is
complete and resumable is judged from its files in :mod:`tuner.launch.checkpoints`.  One scan decides for the Ctrl-C
message, ``--resume``, the wizard and the training entrypoint alike.

The Trainer writes each ``checkpoint-N`` (weights or adapter, optimizer, scheduler, RNG, trainer state, tokenizer);
then tuner's callback adds the lock recipe and ``tuner_checkpoint.json`` with the settings a resume must share.
That file is written last, so it also marks the checkpoint complete: a run killed while saving leaves a folder
without it, and ``resume: auto`` skips that folder.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tuner.rundir.layout import CHECKPOINT_PREFIX

_CHECKPOINT_NAME = re.compile(rf"^{re.escape(CHECKPOINT_PREFIX)}(\d+)$")


# settings added after checkpoints were first written, with the value every older checkpoint was saved under
SAVED_BEFORE = {"objective.kind": "sft", "parallelism.tp": 1, "parallelism.sp": 1, "parallelism.cp": 1}


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
