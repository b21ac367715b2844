"""Disk a run's checkpoints take, sized from the memory plan the caller already has (a plan is never made twice
for one `tuner run`)."""
from __future__ import annotations

from tuner.planner.items import DTYPE_BYTES, GIB, MemoryPlan
from tuner.recipe.schema import Recipe

ADAM_STATE_BYTES = 12  # per trainable parameter: Adam's two fp32 moments and the fp32 master copy


def checkpoint_disk_gib(recipe: Recipe, planned: MemoryPlan) -> float:
    """Kept checkpoints plus the one being written plus the final save.

    Each holds the saved weights (all of them, or only the adapter) and the optimizer state of every trainable
    parameter.
    """
    weight_bytes = DTYPE_BYTES[recipe.model.dtype]  # a validated recipe's dtype is never auto
    saved = planned.params["total"] if recipe.output.save in ("full", "merged") else planned.trainable_params
    per_checkpoint = saved * weight_bytes + planned.trainable_params * ADAM_STATE_BYTES
    kept = (recipe.training.save_total_limit or 2) + 1
    return (kept * per_checkpoint + saved * weight_bytes) / GIB
