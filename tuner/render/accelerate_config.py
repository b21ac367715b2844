"""The Accelerate config YAML that ``accelerate launch --config_file`` reads, for every topology.

The keys are Accelerate's own (``ClusterConfig``); tests load the file back with Accelerate's loader.
How each topology maps:

- one process: ``NO`` (on a GPU, or on the CPU with ``use_cpu``);
- several processes, ddp: ``MULTI_GPU``; on the CPU too, with ``use_cpu: true``: that is the launcher
  path (torchrun) that starts N ranks, and the Trainer's ``use_cpu`` then makes them a gloo group
  (``MULTI_CPU``). Accelerate's own ``MULTI_CPU`` type expects mpirun and starts one process here;
- deepspeed: ``DEEPSPEED`` pointing at the run's deepspeed.json. Precision and batch settings live in
  that file only: Accelerate refuses a config that sets them in both places;
- fsdp: ``FSDP`` version 2, wrapping the model's own decoder-layer class; with ep (and tp 1) ``MULTI_GPU``, since
  transformers shards the model itself while loading it;
- tensor, context and sequence parallelism: Accelerate's ``parallelism_config`` (fsdp with tp/cp, DeepSpeed
  Ulysses' sp); DeepSpeed AutoTP's tp is deepspeed.json's ``tensor_parallel`` instead.
"""
from __future__ import annotations

from typing import Any

import yaml

from tuner.recipe.schema import Recipe

DISTRIBUTED_TYPES = {"none": "NO", "ddp": "MULTI_GPU", "deepspeed": "DEEPSPEED", "fsdp": "FSDP"}
# the attention DeepSpeed Ulysses runs on each rank's heads (eager is refused by the checks; auto: sdpa, which runs
# wherever the GPU is, where flash-attn may not be installed)
SP_ATTENTION = {"flash": "flash_attention_2", "sdpa": "sdpa", "auto": "sdpa"}


def distributed_type(recipe: Recipe) -> str:
    kind = recipe.memory.distributed
    if kind in ("none", "ddp") and recipe.world_size == 1:
        return "NO"  # Accelerate refuses MULTI_GPU with one process
    if kind == "fsdp" and recipe.parallelism.ep > 1 and recipe.parallelism.tp == 1:
        # transformers applies FSDP2 itself while loading (DistributedConfig with ep_size) and the Trainer leaves the
        # model to it: the launcher only starts the ranks, as for ddp (an FSDP plugin would make the Trainer delay
        # the optimizer and load checkpoints as if Accelerate had wrapped the model)
        return "MULTI_GPU"
    return DISTRIBUTED_TYPES[kind]


def fsdp_config(recipe: Recipe, layer_classes: list[str] | None) -> dict[str, Any]:
    """FSDP2 settings. ``layer_classes=None`` leaves the class to Accelerate (the model's ``_no_split_modules``
    at run time), which is what a model-independent preset needs."""
    fsdp, mem = recipe.memory.fsdp, recipe.memory
    config: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_reshard_after_forward": fsdp.sharding_strategy != "shard_grad_op",
        "fsdp_state_dict_type": "FULL_STATE_DICT" if fsdp.state_dict_type == "full" else "SHARDED_STATE_DICT",
        "fsdp_offload_params": mem.offload_params == "cpu",
        "fsdp_cpu_ram_efficient_loading": fsdp.cpu_ram_efficient_loading,
        "fsdp_activation_checkpointing": False,  # the Trainer's gradient_checkpointing does it (recipe.memory)
    }
    if fsdp.cpu_ram_efficient_loading:
        config["fsdp_sync_module_states"] = True  # accelerate launch requires it with RAM-efficient loading
    if layer_classes:
        config["fsdp_transformer_layer_cls_to_wrap"] = ",".join(layer_classes)
    return config


def parallelism_config(recipe: Recipe) -> dict[str, Any]:
    """Accelerate's N-D layout (``ParallelismConfig``), which ``accelerate launch`` turns into PARALLELISM_CONFIG_*
    variables: for fsdp with tp or cp, the recipe's dp_replicate x dp_shard x tp x cp; for fsdp's hybrid_shard alone,
    shard inside a machine and replicate across machines; for DeepSpeed Ulysses (sp), the sp group. Empty when the
    run needs none (DeepSpeed AutoTP's tp lives in deepspeed.json)."""
    par, hw, mem = recipe.parallelism, recipe.hardware, recipe.memory
    if mem.distributed == "fsdp" and par.tp > 1:
        # transformers shards the model itself at load (DistributedConfig: tp, FSDP2 and HSDP replicas), and the
        # Trainer hands Accelerate ParallelismConfig(tp, dp_shard = every data-parallel rank) over these
        # variables: a dp_replicate here would count the replicas twice
        sizes = {"dp_replicate": 1, "dp_shard": par.dp_replicate * par.dp_shard, "tp": par.tp, "cp": 1}
    elif mem.distributed == "fsdp" and par.cp > 1:
        sizes = {"dp_replicate": par.dp_replicate, "dp_shard": par.dp_shard, "tp": 1, "cp": par.cp}
    elif mem.distributed == "fsdp" and mem.fsdp.sharding_strategy == "hybrid_shard":
        sizes = {"dp_replicate": hw.machines, "dp_shard": hw.gpus_per_machine, "tp": 1, "cp": 1}
    elif mem.distributed == "deepspeed" and par.sp > 1:
        return {
            "parallelism_config_sp_size": par.sp,
            "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_seq_length_is_variable": True,  # packed or padded batches vary in length
            "parallelism_config_sp_attn_implementation": SP_ATTENTION[mem.attention],
        }
    else:
        return {}
    config = {f"parallelism_config_{name}_size": size for name, size in sizes.items()}
    if par.cp > 1:
        config["parallelism_config_cp_backend"] = "torch"
    return config


def accelerate_config(recipe: Recipe, deepspeed_file: str | None = None,
                      layer_classes: list[str] | None = None) -> dict[str, Any]:
    """Accelerate's ClusterConfig fields for this recipe.

    ``deepspeed_file``: path of the deepspeed.json as the launch sees it (DeepSpeed runs only).
    ``layer_classes``: the decoder-layer classes FSDP wraps (FSDP runs; see :mod:`tuner.render.model_layers`).
    """
    hw, mem = recipe.hardware, recipe.memory
    kind = distributed_type(recipe)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": kind,
        "num_machines": hw.machines,
        "num_processes": recipe.world_size,
        "machine_rank": 0,
    }
    if kind != "DEEPSPEED":
        config["mixed_precision"] = mem.mixed_precision
    config["use_cpu"] = not recipe.uses_gpu
    if recipe.uses_gpu:
        config["gpu_ids"] = "all"
    if recipe.world_size > 1:
        multi_node = hw.machines > 1
        if multi_node:
            config["main_process_ip"] = hw.main_process_ip
        config["main_process_port"] = hw.main_process_port
        if multi_node:
            config["rdzv_backend"] = hw.rdzv_backend
            # static: every node dials main_process_ip directly; c10d needs the rendezvous endpoint
            config["same_network"] = hw.rdzv_backend == "static"
    if kind == "DEEPSPEED":
        if deepspeed_file is None:
            raise ValueError("a DeepSpeed run needs the path of its deepspeed.json")
        ds: dict[str, Any] = {"deepspeed_config_file": deepspeed_file, "zero3_init_flag": mem.zero_stage == 3}
        if hw.machines > 1:
            ds["deepspeed_multinode_launcher"] = "standard"  # torchrun on each node, as launch.sh does; no pdsh/ssh
        config["deepspeed_config"] = ds
    if kind == "FSDP":
        config["fsdp_config"] = fsdp_config(recipe, layer_classes)
    parallelism = parallelism_config(recipe)
    if parallelism:
        config["parallelism_config"] = parallelism
    config["debug"] = False
    return config


def render_accelerate_config(recipe: Recipe, deepspeed_file: str | None = None,
                             layer_classes: list[str] | None = None) -> str:
    return yaml.safe_dump(accelerate_config(recipe, deepspeed_file, layer_classes), sort_keys=False)
