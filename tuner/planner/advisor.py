"""The advisor: the ladder of memory tactics, searched cheapest first until a plan fits.

Every tactic slows training down by an estimated share of throughput (``RUNG_COST``,
explained in docs/memory.md).  The advisor plans every compatible combination of
sharding, gradient checkpointing, offload, micro-batch size and (when the recipe allows
it) method, keeps those that fit, and ranks them by their summed cost.  A smaller
micro-batch always comes with more gradient accumulation, so the effective batch stays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product

from tuner.planner.memory import MemoryPlan, plan

# Estimated throughput penalty of each rung (fraction of step time added); sources in docs/memory.md.
RUNG_COST = {
    "precompute_reference": 0.01,  # dpo/kto: one pass before training replaces the reference's forward in each step
    "ddp": 0.0,
    "zero1": 0.02,  # same communication volume as DDP; a sharded step
    "zero2": 0.05,  # reduce-scatter instead of all-reduce, a few more syncs
    "micro_batch": 0.08,  # per halving: smaller matmuls use the GPU less well
    "gradient_checkpointing": 0.25,  # one extra forward of ~3 units of compute, partly hidden by lower memory traffic
    "zero3": 0.30,  # 1.5x DDP's communication volume and a gather before every module, rarely fully overlapped
    "offload_optimizer": 0.60,  # optimizer step on the CPU and gradients over PCIe
    "offload_params": 1.20,  # every parameter crosses PCIe twice per step
    "lora": 1.0,  # not slower, but changes what is learned: only when nothing else fits
    "qlora": 1.6,  # dequantisation on every matmul, and quantised base weights
}

LADDER = ("precompute_reference", "ddp", "zero1", "zero2", "micro_batch", "gradient_checkpointing", "zero3", "offload_optimizer",
          "offload_params", "lora", "qlora")


@dataclass(frozen=True)
class Tactics:
    """The knobs the advisor turns."""

    sharding: str  # none, ddp, zero0..zero3, fsdp:<strategy>
    checkpointing: bool
    offload_optimizer: str
    offload_params: str
    micro_batch: int
    method: str
    precompute: bool = False  # dpo/kto: reference log-probabilities computed before training (no reference copy)


@dataclass
class Advice:
    """One plan the advisor proposes: the changed recipe, its memory plan and why each change was needed."""

    recipe: object
    plan: MemoryPlan
    cost: float  # estimated throughput penalty against the recipe as given (0.3 = ~30% slower)
    reasons: list[str]
    changes: list[str] = field(default_factory=list)  # rung names, in ladder order
    largest_micro_batch: int | None = None
    accumulation_for_largest: int | None = None

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def summary(self) -> str:
        if not self.fits:
            return self.reasons[0]
        head = "as is" if not self.changes else " + ".join(self.changes)
        return f"{head}: {self.plan.gpu.total_gib:.1f} GiB of {self.plan.gpu.capacity_gib:.1f} GiB, ~{self.cost:.0%} slower"


def _tactics_of(recipe) -> Tactics:
    mem = recipe.memory
    if mem.distributed == "deepspeed":
        sharding = f"zero{mem.zero_stage}"
    elif mem.distributed == "fsdp":
        sharding = f"fsdp:{mem.fsdp.sharding_strategy}"
    else:
        sharding = mem.distributed
    return Tactics(sharding, mem.gradient_checkpointing, mem.offload_optimizer, mem.offload_params,
                   mem.micro_batch_size, recipe.method.kind, recipe.objective.precompute_ref_log_probs)


_SHARDING_RANK = {"none": 0, "ddp": 0, "zero0": 0, "zero1": 1, "zero2": 2, "zero3": 3,
                  "fsdp:no_shard": 0, "fsdp:shard_grad_op": 2, "fsdp:hybrid_shard": 3, "fsdp:full_shard": 3}


def _rungs(base: Tactics, t: Tactics) -> list[str]:
    """The ladder rungs ``t`` climbs above ``base``."""
    rungs = ["precompute_reference"] if t.precompute and not base.precompute else []
    rank_base, rank = _SHARDING_RANK[base.sharding], _SHARDING_RANK[t.sharding]
    if rank > rank_base:  # each stage includes the ones below it: only the highest counts
        rungs.append(("zero1", "zero2", "zero3")[rank - 1])
    if t.checkpointing and not base.checkpointing:
        rungs.append("gradient_checkpointing")
    if t.offload_optimizer != "none" and base.offload_optimizer == "none":
        rungs.append("offload_optimizer")
    if t.offload_params != "none" and base.offload_params == "none":
        rungs.append("offload_params")
    halvings = int(round(math.log2(base.micro_batch / t.micro_batch))) if t.micro_batch < base.micro_batch else 0
    rungs += ["micro_batch"] * halvings
    if t.method != base.method:
        rungs += ["lora"] if t.method == "lora" else (["qlora"] if base.method == "lora" else ["lora", "qlora"])
    return sorted(rungs, key=LADDER.index)


def _cost(rungs: list[str]) -> float:
    return sum(RUNG_COST[r] for r in rungs)


def _apply(recipe, t: Tactics):
    """The recipe with tactics ``t``, keeping the effective batch (not yet validated)."""
    mem, method = recipe.memory, recipe.method
    effective = mem.micro_batch_size * mem.gradient_accumulation_steps
    update = {"gradient_checkpointing": t.checkpointing, "offload_optimizer": t.offload_optimizer,
              "offload_params": t.offload_params, "micro_batch_size": t.micro_batch,
              "gradient_accumulation_steps": max(1, math.ceil(effective / t.micro_batch))}
    if t.sharding.startswith("zero"):
        update.update(distributed="deepspeed", zero_stage=int(t.sharding[-1]))
        if mem.optimizer not in ("adamw_torch", "adamw_torch_fused"):
            update["optimizer"] = "adamw_torch"  # DeepSpeed brings its own optimizer
    elif t.sharding.startswith("fsdp:"):
        update.update(distributed="fsdp", zero_stage=None,
                      fsdp=mem.fsdp.model_copy(update={"sharding_strategy": t.sharding.split(":")[1]}))
    else:
        update.update(distributed=t.sharding, zero_stage=None)
    changes = {"memory": mem.model_copy(update=update)}
    if t.precompute != recipe.objective.precompute_ref_log_probs:
        changes["objective"] = recipe.objective.model_copy(update={"precompute_ref_log_probs": t.precompute})
    if t.method != method.kind:
        quant = method.quantization
        if t.method == "qlora" and quant is None:
            from tuner.recipe.schema import QuantizationSection

            quant = QuantizationSection()
        changes["method"] = method.model_copy(update={"kind": t.method, "quantization": quant if t.method == "qlora" else None})
        if recipe.output.save == "full" and t.method != "full":
            changes["output"] = recipe.output.model_copy(update={"save": "adapter"})
    return recipe.model_copy(update=changes)


def _candidates(recipe) -> list[Tactics]:
    base = _tactics_of(recipe)
    world, on_gpu = recipe.world_size, recipe.uses_gpu
    fsdp = recipe.memory.distributed == "fsdp"
    if not on_gpu:
        shardings = [base.sharding]
    elif fsdp:
        shardings = ["fsdp:shard_grad_op", "fsdp:full_shard"]
    else:
        shardings = (["ddp"] if world > 1 else ["none"]) + ["zero1", "zero2", "zero3"]
    shardings = [s for s in shardings if _SHARDING_RANK[s] >= _SHARDING_RANK[base.sharding]] or [base.sharding]
    batches = [base.micro_batch]
    while batches[-1] > 1:
        batches.append(batches[-1] // 2)
    methods = [base.method]
    if recipe.method.allow_method_change:
        methods += {"full": ["lora", "qlora"], "lora": ["qlora"], "qlora": []}[base.method]
    offload = ["none", "cpu"] if on_gpu else ["none"]
    # dpo/kto with full fine-tuning may drop the reference copy (LoRA needs none: its disabled adapter is the reference)
    precompute = [base.precompute] + ([True] if recipe.objective.preference and not base.precompute else [])
    out = []
    for sharding, ckpt, opt_off, par_off, mb, meth, pre in product(shardings, (False, True), offload, offload, batches,
                                                                   methods, precompute):
        if pre and not base.precompute and meth != "full":
            continue
        if base.checkpointing and not ckpt:
            continue
        if (base.offload_optimizer != "none" and opt_off == "none") or (base.offload_params != "none" and par_off == "none"):
            continue
        if opt_off != "none" and base.offload_optimizer != "none":
            opt_off = base.offload_optimizer
        if par_off != "none" and base.offload_params != "none":
            par_off = base.offload_params
        out.append(Tactics(sharding, ckpt, opt_off, par_off, mb, meth, pre))
    return list(dict.fromkeys(out))


_REASONS = {
    "precompute_reference": "the reference model's log-probabilities are computed in one pass before training, so no "
                            "frozen copy of the model stays beside it (objective.precompute_ref_log_probs)",
    "zero1": "ZeRO-1 shards the optimizer states over the {world} GPUs",
    "zero2": "ZeRO-2 shards the optimizer states and gradients over the {world} GPUs",
    "zero3": "ZeRO-3 shards the optimizer states, gradients and parameters (gathered layer by layer) over the {world} GPUs",
    "gradient_checkpointing": "gradient checkpointing keeps only each layer's input and recomputes the rest",
    "offload_optimizer": "optimizer states and the optimizer step move to CPU RAM",
    "offload_params": "parameters move to CPU RAM between uses",
    "micro_batch": "micro-batch {mb} with {acc} accumulation steps keeps the effective batch of {eff}",
    "lora": "LoRA trains small adapters instead of every weight (method.allow_method_change)",
    "qlora": "QLoRA stores the frozen base weights in 4 bits (method.allow_method_change)",
}


def _reasons(recipe, changes: list[str], before: MemoryPlan, after: MemoryPlan) -> list[str]:
    mem = recipe.memory
    values = {"world": recipe.world_size, "mb": mem.micro_batch_size, "acc": mem.gradient_accumulation_steps,
              "eff": mem.micro_batch_size * mem.gradient_accumulation_steps}
    lines = [_REASONS[c].format(**values) for c in dict.fromkeys(changes)]
    if recipe.objective.preference and "lora" in changes:
        lines.append("with LoRA the reference is the model with its adapter disabled: no frozen copy")
    if recipe.world_size == 1:
        lines = [line.replace(" over the 1 GPUs", " (on one GPU: what lets DeepSpeed offload)") for line in lines]
    if recipe.memory.distributed == "fsdp":
        lines = [line.replace("ZeRO-2", "FSDP shard_grad_op").replace("ZeRO-3", "FSDP full_shard") for line in lines]
    if changes:
        lines.append(f"peak {before.gpu.total_gib:.1f} -> {after.gpu.total_gib:.1f} GiB per device")
    return lines


def _finish(recipe):
    """Validate a candidate fully (schema and cross-field rules) so it is a recipe tuner can run."""
    from tuner.recipe.io import validate_recipe

    return validate_recipe(recipe.model_dump(mode="json"))


def _runnable(candidate) -> bool:
    """Whether a candidate passes validation (e.g. accumulation within its limit of 65536)."""
    from tuner.recipe.io import RecipeError

    try:
        _finish(candidate)
    except RecipeError:
        return False
    return True


def largest_micro_batch(recipe, limit: int = 4096) -> tuple[int, int] | None:
    """The largest micro-batch that still fits, and the accumulation that keeps the recipe's effective batch."""
    mem = recipe.memory
    effective = mem.micro_batch_size * mem.gradient_accumulation_steps

    def fits(mb: int) -> bool:
        return plan(_with_batch(recipe, mb, effective)).verdict in ("fits", "tight")

    if not fits(1):
        return None
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low, max(1, math.ceil(effective / low))


def _with_batch(recipe, mb: int, effective: int):
    memory = recipe.memory.model_copy(update={"micro_batch_size": mb,
                                              "gradient_accumulation_steps": max(1, math.ceil(effective / mb))})
    return recipe.model_copy(update={"memory": memory})


def advise(recipe, limit: int = 5) -> list[Advice]:
    """Plans that fit, cheapest first (at most ``limit``); or one non-fitting Advice saying how much is missing."""
    from tuner.recipe.checks import find_problems

    before = plan(recipe)
    base = _tactics_of(recipe)
    scored = []
    for tactics in _candidates(recipe):
        candidate = _apply(recipe, tactics) if tactics != base else recipe
        if tactics != base and find_problems(candidate):
            continue  # e.g. 8-bit QLoRA with ZeRO-3, offload without sharding
        memory_plan = plan(candidate)
        changes = _rungs(base, tactics)
        scored.append((memory_plan.fits, _cost(changes), memory_plan.gpu.total_gib, tactics, candidate, memory_plan, changes))
    fitting = [s for s in sorted((s for s in scored if s[0]), key=lambda s: (s[1], s[2]))
               if s[4] is recipe or _runnable(s[4])]  # a rung can push a field past its limit (found by fuzzing)
    if not fitting:
        best = min(scored, key=lambda s: s[5].missing_gib)
        _, cost, _, _, candidate, memory_plan, changes = best
        gpu = memory_plan.gpu
        reason = (f"nothing fits on {gpu.name}: {memory_plan.missing_gib:.1f} GiB missing per device even with "
                  f"{' + '.join(changes) or 'the recipe as is'}; add GPUs, use larger ones, shorten max_seq_length"
                  + ("" if recipe.method.allow_method_change or recipe.method.kind == "qlora"
                     else ", or set method.allow_method_change to allow LoRA/QLoRA") + ".")
        return [Advice(candidate, memory_plan, cost, [reason] + _reasons(candidate, changes, before, memory_plan), changes)]
    advice = []
    seen_configs = set()
    for _, cost, _, tactics, candidate, memory_plan, changes in fitting:
        key = (tactics.sharding, tactics.checkpointing, tactics.offload_optimizer, tactics.offload_params, tactics.method,
               tactics.precompute)
        if key in seen_configs:  # the same tactics with a smaller micro-batch: only the cheapest
            continue
        seen_configs.add(key)
        finished = candidate if candidate is recipe else _finish(candidate)
        reasons = _reasons(finished, changes, before, memory_plan) or [f"fits as is ({memory_plan.verdict})"]
        advice.append(Advice(finished, memory_plan, cost, reasons, changes))
        if len(advice) == limit:
            break
    chosen = advice[0]
    found = largest_micro_batch(chosen.recipe)
    if found:
        chosen.largest_micro_batch, chosen.accumulation_for_largest = found
    return advice


def next_rung(recipe) -> str | None:
    """The name of the next ladder rung the recipe has not climbed (for an out-of-memory handler), or None.

    Names: precompute_reference, zero1, zero2, micro_batch, gradient_checkpointing, zero3, offload_optimizer,
    offload_params, lora, qlora.
    """
    t = _tactics_of(recipe)
    multi = recipe.world_size > 1 and recipe.uses_gpu
    rank = _SHARDING_RANK[t.sharding]
    for rung in LADDER:
        if rung == "precompute_reference" and recipe.objective.preference and t.method == "full" and not t.precompute:
            return rung
        if rung == "zero1" and multi and rank < 1 and not t.sharding.startswith("fsdp"):
            return rung
        if rung == "zero2" and multi and rank < 2:
            return rung
        if rung == "micro_batch" and t.micro_batch > 1:
            return rung
        if rung == "gradient_checkpointing" and not t.checkpointing:
            return rung
        if rung == "zero3" and recipe.uses_gpu and rank < 3:
            return rung
        if rung == "offload_optimizer" and recipe.uses_gpu and rank >= 1 and t.offload_optimizer == "none":
            return rung
        if rung == "offload_params" and recipe.uses_gpu and rank >= 3 and t.offload_params == "none" and t.method != "qlora":
            return rung
        if rung in ("lora", "qlora") and recipe.method.allow_method_change:
            if (rung == "lora" and t.method == "full") or (rung == "qlora" and t.method == "lora"):
                return rung
    return None
