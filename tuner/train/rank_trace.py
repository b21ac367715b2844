"""Per-rank evidence of data and tensor parallelism, for tests: which samples each rank's first batch held, and
each rank's final weights (their sum, and the shape of each as this rank holds it: a tensor-parallel rank holds
its slice, an expert-parallel one its experts). Off unless TUNER_TRACE_RANKS=1, so a normal run pays nothing for it."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from transformers import TrainerCallback

from tuner.rundir.events import RankBatch, RankFinished, write_event

TRACE_RANKS_VARIABLE = "TUNER_TRACE_RANKS"


def tracing_ranks() -> bool:
    return os.environ.get(TRACE_RANKS_VARIABLE) == "1"


def held(parameter):
    """The part of ``parameter`` this rank holds: a DTensor's local shard (transformers' FSDP2 and expert shards),
    else the tensor itself."""
    return parameter.to_local() if hasattr(parameter, "to_local") else parameter


def parameters_checksum(model) -> float:
    """Sum of every parameter, gathered one at a time under ZeRO-3 (equal on every rank of a healthy run); of a
    DTensor, the rank's own shard."""
    from contextlib import nullcontext

    total = 0.0
    for parameter in model.parameters():
        gather = nullcontext()
        if hasattr(parameter, "ds_id"):  # a ZeRO-3 partitioned parameter
            import deepspeed

            gather = deepspeed.zero.GatheredParameters([parameter])
        with gather:
            total += float(held(parameter).detach().double().sum())
    return total


class RankTrace(TrainerCallback):
    """Wraps the data collator to see each rank's first batch; reports the weights at the end of training."""

    def __init__(self, events_path: Path, collator):
        self.path = events_path
        self.collator = collator
        self.rank = int(os.environ.get("RANK", "0"))
        self._first_seen = False

    def collate(self, features):
        if not self._first_seen:
            self._first_seen = True
            samples = [hashlib.sha1(str(list(f["input_ids"])).encode()).hexdigest()[:12] for f in features]
            write_event(self.path, RankBatch(rank=self.rank, pid=os.getpid(), samples=samples))
        return self.collator(features)

    def on_train_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():  # FSDP2 keeps the root unsharded after a forward (reshard_after_forward off)
            if isinstance(module, FSDPModule):
                module.reshard()
        inner = optimizer  # Accelerate's and DeepSpeed's wrappers each hold the next one in .optimizer
        while getattr(inner, "optimizer", inner) is not inner:
            inner = inner.optimizer
        write_event(self.path, RankFinished(
            rank=self.rank, world_size=args.world_size, optimizer=type(inner).__name__,
            parameters_checksum=parameters_checksum(model),
            shapes={name: list(held(parameter).shape) for name, parameter in model.named_parameters()}))
