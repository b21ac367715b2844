"""The Accelerate config YAML that ``accelerate launch --config_file`` reads."""
from __future__ import annotations

from typing import Any

import yaml

from tuner.recipe.schema import Recipe


def accelerate_config(recipe: Recipe) -> dict[str, Any]:
    """Accelerate's ClusterConfig fields for this recipe (single process for now)."""
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "NO",
        "num_machines": recipe.hardware.machines,
        "num_processes": recipe.world_size,
        "machine_rank": 0,
        "mixed_precision": recipe.memory.mixed_precision,
        "use_cpu": not recipe.uses_gpu,
        "debug": False,
    }


def render_accelerate_config(recipe: Recipe) -> str:
    return yaml.safe_dump(accelerate_config(recipe), sort_keys=False)
