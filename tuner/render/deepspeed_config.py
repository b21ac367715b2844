"""``deepspeed.json``: the ZeRO configuration the Trainer hands to DeepSpeed.

Every value the Trainer knows (batch sizes, accumulation, clipping, precision, optimizer
hyper-parameters, bucket sizes from the model's hidden size) is ``"auto"``: the Trainer fills it from
the same recipe-derived TrainingArguments, so this file and the recipe cannot disagree.  With tensor parallelism
it also holds DeepSpeed AutoTP's ``tensor_parallel.autotp_size``.
"""
from __future__ import annotations

import json
from typing import Any

from tuner.recipe.schema import Recipe


def _offload(device: str, nvme_path: str | None, pin_memory: bool) -> dict[str, Any]:
    offload: dict[str, Any] = {"device": device, "pin_memory": pin_memory}
    if device == "nvme":
        offload["nvme_path"] = nvme_path
    return offload


def zero_optimization(recipe: Recipe) -> dict[str, Any]:
    mem, hw = recipe.memory, recipe.hardware
    stage = mem.zero_stage or 0
    zero: dict[str, Any] = {"stage": stage}
    pin = recipe.uses_gpu  # pinned host memory needs CUDA
    if stage >= 1 and mem.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(mem.offload_optimizer, hw.nvme_path, pin)
    if stage == 3 and mem.offload_params != "none":
        zero["offload_param"] = _offload(mem.offload_params, hw.nvme_path, pin)
    if stage >= 2:
        zero["overlap_comm"] = recipe.uses_gpu
        zero["contiguous_gradients"] = True
        zero["reduce_bucket_size"] = "auto"
    if stage == 3:
        zero["stage3_prefetch_bucket_size"] = "auto"
        zero["stage3_param_persistence_threshold"] = "auto"
    if stage == 3 or recipe.parallelism.tp > 1:
        # without it a ZeRO-3 or AutoTP save writes each rank's slice (or empty placeholders), not whole weights:
        # DeepSpeed gathers the split weights to rank 0 only when asked (the name is ZeRO-3's, the switch both's)
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return zero


def deepspeed_config(recipe: Recipe) -> dict[str, Any]:
    mem = recipe.memory
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
        "zero_optimization": zero_optimization(recipe),
    }
    if recipe.parallelism.tp > 1:
        # DeepSpeed AutoTP: the Trainer splits the model's linears (deepspeed.tp_model_init) across tp ranks, and
        # Accelerate gives the ranks of one tp group the same batches
        config["tensor_parallel"] = {"autotp_size": recipe.parallelism.tp}
    if mem.offload_optimizer != "none":
        # an offloaded optimizer step runs on the CPU: DeepSpeed's own (CPU) Adam, not the Trainer's torch one
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    config["steps_per_print"] = 1_000_000_000  # progress comes from tuner's events, not DeepSpeed's prints
    config["wall_clock_breakdown"] = False
    return config


def render_deepspeed_config(recipe: Recipe) -> str:
    return json.dumps(deepspeed_config(recipe), indent=2) + "\n"
