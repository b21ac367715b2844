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
- fsdp with ep: the same loading with ``ep_size`` (each rank ``num_experts / ep`` whole experts, tokens routed to
  them all-to-all; :mod:`tuner.recipe.expert_checks`). With tp 1 the Trainer asks Accelerate for no
  ParallelismConfig, so it runs on gloo CPU ranks as well (``demo-moe-ep``).

The Trainer checkpoints such a model's weights only (it refuses to save their optimizer state): :class:`ShardedTrainer`
adds the sharded optimizer state through torch's distributed checkpoint, and the scheduler, so a run resumes whole.
"""
from __future__ import annotations

from typing import Any

from tuner.recipe.schema import Recipe


def loads_sharded(recipe: Recipe) -> bool:
    """Whether transformers shards the model while loading it (fsdp with tp or ep), which changes what a checkpoint
    holds."""
    return recipe.memory.distributed == "fsdp" and (recipe.parallelism.tp > 1 or recipe.parallelism.ep > 1)


def distributed_config(recipe: Recipe):
    """transformers' DistributedConfig for fsdp with tp or ep: tp inside, FSDP2 over dp_shard, HSDP replicas over
    dp_replicate, each rank holding num_experts / ep experts (the recipe's sizes; their product is the world size,
    which transformers checks at load)."""
    from transformers.distributed import DistributedConfig

    par, mem = recipe.parallelism, recipe.memory
    return DistributedConfig(
        tp_size=par.tp, fsdp_size=par.dp_shard, dp_replicate_size=par.dp_replicate, ep_size=par.ep,
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


SHARDED_OPTIMIZER_DIR = "sharded_optimizer"  # in a checkpoint: torch.distributed.checkpoint's files, one per rank


def sharded_trainer_class():
    """The Trainer for a model transformers sharded at load: checkpoints that resume (weights, optimizer, scheduler).

    transformers saves such a model's gathered weights (``save_only_model``) but loads a checkpoint back with a plain
    ``load_state_dict``, which fails on DTensor parameters ("got mixed torch.Tensor and DTensor"). Here the weights go
    back through torch's ``set_model_state_dict`` (full tensors, each rank keeping its shard) and the optimizer state
    is saved and loaded sharded with torch's distributed checkpoint (DCP), whatever mesh each parameter lives on."""
    import os

    import torch
    from transformers import Trainer
    from transformers.trainer import SCHEDULER_NAME

    def _optimizer(trainer):
        return getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # under Accelerate's wrapper

    class ShardedTrainer(Trainer):
        def _save_checkpoint(self, model, trial):
            super()._save_checkpoint(model, trial)
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            checkpoint = os.path.join(self._get_output_dir(trial), f"checkpoint-{self.state.global_step}")
            dcp.save({"optimizer": get_optimizer_state_dict(self.model, _optimizer(self))},
                     checkpoint_id=os.path.join(checkpoint, SHARDED_OPTIMIZER_DIR))
            if self.args.should_save:
                torch.save(self.lr_scheduler.state_dict(), os.path.join(checkpoint, SCHEDULER_NAME))

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            from safetensors.torch import load_file
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
            from transformers.utils import SAFE_WEIGHTS_NAME

            weights = load_file(os.path.join(resume_from_checkpoint, SAFE_WEIGHTS_NAME))
            # strict=False: a tied head is saved once, under the embedding's name
            set_model_state_dict(model or self.model, weights, options=StateDictOptions(full_state_dict=True,
                                                                                       strict=False))

        def _load_optimizer_and_scheduler(self, checkpoint):
            if checkpoint is None:
                return
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

            optimizer = _optimizer(self)
            state = {"optimizer": get_optimizer_state_dict(self.model, optimizer)}
            dcp.load(state, checkpoint_id=os.path.join(checkpoint, SHARDED_OPTIMIZER_DIR))
            set_optimizer_state_dict(self.model, optimizer, state["optimizer"])
            scheduler = os.path.join(checkpoint, SCHEDULER_NAME)
            self.lr_scheduler.load_state_dict(torch.load(scheduler, weights_only=True))

    return ShardedTrainer
