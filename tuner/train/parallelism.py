"""Tensor parallelism in the training entrypoint: how the model is loaded for it, and the evaluation batch it needs.

Two paths, as the recipe's ``memory.distributed`` says:

- deepspeed: DeepSpeed AutoTP. deepspeed.json's ``tensor_parallel.autotp_size`` is all it takes: the Trainer splits
  the loaded model (``deepspeed.tp_model_init``), Accelerate builds the tp mesh that gives the ranks of one tp group
  the same batches, and a save gathers the split weights to rank 0 (``_consolidated_16bit_state_dict``). Runs on
  CPU ranks (gloo) and GPUs.
- fsdp: transformers' own tensor-parallel plan with FSDP2, both applied while loading
  (``from_pretrained(distributed_config=DistributedConfig(tp_size, fsdp_size, dp_replicate_size))``); the Trainer
  then hands Accelerate a ``ParallelismConfig`` of the same sizes and leaves the model unwrapped. GPUs only:
  Accelerate refuses a ParallelismConfig on CPU ranks (``DistributedType.MULTI_CPU``).
"""
from __future__ import annotations

from typing import Any

from tuner.recipe.schema import Recipe


def loads_sharded(recipe: Recipe) -> bool:
    """Whether transformers shards the model while loading it (fsdp with tp), which changes what a checkpoint holds."""
    return recipe.memory.distributed == "fsdp" and recipe.parallelism.tp > 1


def distributed_config(recipe: Recipe):
    """transformers' DistributedConfig for fsdp with tp: tp inside, FSDP2 over dp_shard, HSDP replicas over
    dp_replicate (the recipe's sizes; their product is the world size, which transformers checks at load)."""
    from transformers.distributed import DistributedConfig

    par, mem = recipe.parallelism, recipe.memory
    return DistributedConfig(
        tp_size=par.tp, fsdp_size=par.dp_shard, dp_replicate_size=par.dp_replicate,
        fsdp_cpu_offload=mem.offload_params == "cpu",
        fsdp_mixed_precision=mem.mixed_precision == "bf16",  # bf16 compute over the loaded weights, fp32 reduction
    )


def loading_arguments(recipe: Recipe) -> dict[str, Any]:
    """What ``from_pretrained`` adds for this recipe's parallelism (nothing unless transformers shards at load)."""
    return {"distributed_config": distributed_config(recipe)} if loads_sharded(recipe) else {}


def whole_eval_batch(micro_batch_size: int, eval_samples: int) -> int:
    """The largest evaluation batch up to the micro-batch that divides the held-out set.

    Under AutoTP every rank of a tp group evaluates the same batches and the Trainer gathers all of them, but
    Accelerate trims a short last batch as if there were one rank (``gather_for_metrics``' remainder counts data-
    parallel ranks only): the short batch would weigh half as much as the others in the held-out loss. Batches of
    equal size are never trimmed, so the mean is the true one."""
    return next(size for size in range(min(micro_batch_size, eval_samples), 0, -1) if eval_samples % size == 0)
