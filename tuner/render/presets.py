"""Ready Accelerate configs for your own scripts, written by the same renderer as every run directory.

``tuner presets cp DIR`` writes them (an installed tuner carries no copy: it renders them); the repository ships the
same files in ``accelerate_configs/``, and a test keeps those equal to the renderer's output.  Each preset is one
machine with bf16 (8 GPUs but single_gpu); change ``num_processes`` (or pass ``--num_processes``) for another GPU
count.  DeepSpeed presets point at their JSON by the path they were written to (relative to the folder
``tuner presets cp`` ran in, when DIR is relative).
"""
from __future__ import annotations

import shlex
import textwrap

from tuner.recipe.io import validate_recipe
from tuner.recipe.tactics import Rung, apply_tactics, climb
from tuner.render.accelerate_config import render_accelerate_config
from tuner.render.deepspeed_config import render_deepspeed_config

PRESETS_DIR = "accelerate_configs"
GPUS = 8

# name -> (when to use it, recipe memory section, the ladder's rungs climbed from it)
PRESETS: dict[str, tuple[str, dict, tuple[Rung, ...]]] = {
    "single_gpu": ("One GPU, no sharding: the model, its gradients and optimizer states fit on one device.",
                   {}, ()),
    "ddp": ("Several GPUs, each holding a full replica (DDP): the fastest choice whenever the model, gradients and "
            "optimizer states fit on one GPU.", {"distributed": "ddp"}, ()),
    Rung.ZERO1: ("DeepSpeed ZeRO-1: shards only the optimizer states (Adam's 12 bytes per parameter); about DDP's "
                 "speed. Use when DDP is just short of memory.", {"distributed": "ddp"}, (Rung.ZERO1,)),
    Rung.ZERO2: ("DeepSpeed ZeRO-2: shards optimizer states and gradients; the usual first step when DDP does not fit.",
                 {"distributed": "ddp"}, (Rung.ZERO2,)),
    Rung.ZERO3: ("DeepSpeed ZeRO-3: also shards the parameters, so no GPU holds the whole model; for models whose "
                 "weights alone crowd one GPU. Saves gathered 16-bit weights.", {"distributed": "ddp"}, (Rung.ZERO3,)),
    "zero3_offload": ("DeepSpeed ZeRO-3 with parameters and optimizer states offloaded to CPU RAM: the largest models "
                      "on few GPUs, at a large speed cost; needs host RAM for ~16 bytes per parameter.",
                      {"distributed": "ddp"}, (Rung.ZERO3, Rung.OFFLOAD_OPTIMIZER, Rung.OFFLOAD_PARAMS)),
    "fsdp": ("PyTorch FSDP2, full sharding (like ZeRO-3, native to PyTorch); wraps each decoder layer named by the "
             "model's _no_split_modules.", {"distributed": "fsdp"}, ()),
}


def preset_recipe(name: str):
    _, section, rungs = PRESETS[name]
    memory = {"mixed_precision": "bf16", **section}
    gpus = 1 if memory.get("distributed", "none") == "none" else GPUS
    recipe = validate_recipe({"name": name, "hardware": {"gpus_per_machine": gpus, "gpu": "H100-80GB"}, "memory": memory})
    for rung in rungs:
        recipe = validate_recipe(apply_tactics(recipe, climb(recipe, rung)).model_dump(mode="json"))
    return recipe


def render_presets(directory: str = PRESETS_DIR) -> dict[str, str]:
    """File name (inside ``directory``) -> text; the DeepSpeed presets name their JSON as ``directory/NAME.json``."""
    files = {}
    for name, (when, _, _) in PRESETS.items():
        recipe = preset_recipe(name)
        deepspeed_file = None
        if recipe.memory.distributed == "deepspeed":
            deepspeed_file = f"{directory}/{name}.json"
            files[f"{name}.json"] = render_deepspeed_config(recipe)
        gpus = f"{recipe.world_size} GPU{'s' if recipe.world_size > 1 else ''}"
        launch = shlex.join(["accelerate", "launch", "--config_file", f"{directory}/{name}.yaml", "your_script.py"])
        header = ("".join(f"# {line}\n" for line in textwrap.wrap(when, 100)) + f"# {launch}  "
                  f"({gpus}{': change num_processes for yours' if recipe.world_size > 1 else ''})\n"
                  "# Written by `tuner presets cp` from tuner's renderer.\n")
        files[f"{name}.yaml"] = header + render_accelerate_config(recipe, deepspeed_file)
    return files
