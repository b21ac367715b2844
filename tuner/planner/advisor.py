"""The advisor: the ladder of memory tactics, searched cheapest first until a plan fits.

The rungs and what each changes in a recipe are defined once in :mod:`tuner.recipe.tactics`.  Every tactic slows
training down by an estimated share of throughput (``RUNG_COST``, explained in docs/memory.md).  The advisor plans
every compatible combination of sharding, gradient checkpointing, activation offloading, the chunked loss, offload,
micro-batch size and (when the recipe allows it) method, keeps those whose every phase fits, and ranks them by their
summed cost.  A smaller micro-batch always comes with more gradient accumulation, so the effective batch stays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import product

from tuner.planner.memory import MemoryPlan, plan
from tuner.recipe.tactics import (
    LADDER,
    SHARDING_RUNGS,
    Rung,
    Tactics,
    apply_tactics,
    climb,
    recipe_changes,
    rungs_between,
    sharding_level,
    tactics_of,
)

# Estimated throughput penalty of each rung (fraction of step time added); sources in docs/memory.md.
RUNG_COST = {
    Rung.PRECOMPUTE_REFERENCE: 0.01,  # dpo/kto: one pass before training replaces the reference's forward in each step
    Rung.ZERO1: 0.02,  # same communication volume as DDP; a sharded step
    Rung.CHUNKED_LOSS: 0.03,  # the loss in token chunks: more, smaller kernels; no recomputation
    Rung.ZERO2: 0.05,  # reduce-scatter instead of all-reduce, a few more syncs
    Rung.MICRO_BATCH: 0.08,  # per halving: smaller matmuls use the GPU less well
    Rung.GRADIENT_CHECKPOINTING: 0.25,  # one extra forward of ~3 units of compute, partly hidden by lower memory traffic
    Rung.ACTIVATION_OFFLOADING: 0.15,  # the checkpointed inputs cross PCIe twice per step, on the compute stream
    Rung.ZERO3: 0.30,  # 1.5x DDP's communication volume and a gather before every module, rarely fully overlapped
    Rung.OFFLOAD_OPTIMIZER: 0.60,  # optimizer step on the CPU and gradients over PCIe
    Rung.OFFLOAD_PARAMS: 1.20,  # every parameter crosses PCIe twice per step
    Rung.LORA: 1.0,  # not slower, but changes what is learned: only when nothing else fits
    Rung.QLORA: 1.6,  # dequantisation on every matmul, and quantised base weights
}


@dataclass
class Advice:
    """One plan the advisor proposes: the changed recipe, its memory plan and why each change was needed."""

    recipe: object
    plan: MemoryPlan
    cost: float  # estimated throughput penalty against the recipe as given (0.3 = ~30% slower)
    reasons: list[str]
    changes: list[Rung] = field(default_factory=list)  # rung names, in ladder order
    largest_micro_batch: int | None = None
    accumulation_for_largest: int | None = None
    overrides: list[str] = field(default_factory=list)  # the --set lines that turn the recipe as given into this one

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def summary(self) -> str:
        if not self.fits:
            return self.reasons[0]
        head = "as is" if not self.changes else rung_list(self.changes)
        return f"{head}: {self.plan.gpu.total_gib:.1f} GiB of {self.plan.gpu.capacity_gib:.1f} GiB, ~{self.cost:.0%} slower"


def rung_list(rungs: list[Rung]) -> str:
    """'micro_batch ×3 + gradient_checkpointing': each rung once, with how often it is climbed."""
    counts = {rung: rungs.count(rung) for rung in dict.fromkeys(rungs)}
    return " + ".join(f"{rung} ×{count}" if count > 1 else str(rung) for rung, count in counts.items())


def _cost(rungs: list[Rung]) -> float:
    return sum(RUNG_COST[r] for r in rungs)


def _candidates(recipe) -> list[Tactics]:
    base = tactics_of(recipe)
    world, on_gpu, machines = recipe.world_size, recipe.uses_gpu, recipe.hardware.machines
    if not on_gpu:
        shardings = [base.sharding]
    elif base.sharding.startswith("fsdp:"):
        shardings = [base.sharding, "fsdp:shard_grad_op", "fsdp:full_shard"]
    else:
        # on one GPU ZeRO-1/2 shard nothing; ZeRO-3 is what lets DeepSpeed offload
        shardings = ["ddp", *(rung.value for rung in SHARDING_RUNGS)] if world > 1 else ["none", Rung.ZERO3.value]
    level = sharding_level(base.sharding, machines)
    shardings = list(dict.fromkeys(s for s in shardings if s == base.sharding or sharding_level(s, machines) > level))
    batches = [base.micro_batch]
    while batches[-1] > 1:
        batches.append(batches[-1] // 2)
    methods = [base.method]
    if recipe.method.allow_method_change:
        methods += {"full": ["lora", "qlora"], "lora": ["qlora"], "qlora": []}[base.method]
    offload = ["none", "cpu"] if on_gpu else ["none"]

    def at_least(value, floor):  # a tactic the recipe already uses is kept
        return [v for v in value if v or not floor]

    # dpo/kto with full fine-tuning may drop the reference copy (LoRA needs none: its disabled adapter is the reference)
    precompute = at_least((False, True) if recipe.objective.preference else (False,), base.precompute_reference)

    out = []
    for sharding, ckpt, act_off, chunked, opt_off, par_off, mb, meth, pre in product(
            shardings, at_least((False, True), base.checkpointing), at_least((False, True) if on_gpu else (False,),
                                                                              base.activation_offloading),
            at_least((False, True), base.chunked_loss), offload, offload, batches, methods, precompute):
        if act_off and not ckpt:
            continue  # offloading holds the checkpointed inputs
        if pre and not base.precompute_reference and meth != "full":
            continue
        if (base.offload_optimizer != "none" and opt_off == "none") or (base.offload_params != "none" and par_off == "none"):
            continue
        if opt_off != "none" and base.offload_optimizer != "none":
            opt_off = base.offload_optimizer
        if par_off != "none" and base.offload_params != "none":
            par_off = base.offload_params
        out.append(Tactics(sharding, ckpt, opt_off, par_off, mb, meth, chunked, act_off, pre))
    return list(dict.fromkeys(out))


# Why each rung helps, said once: the advice, the plan's reasons and the out-of-memory message all use it.
REASONS = {
    Rung.PRECOMPUTE_REFERENCE: "the reference model's log-probabilities are computed in one pass before training, so "
                               "no frozen copy of the model stays beside it (objective.precompute_ref_log_probs)",
    Rung.ZERO1: "ZeRO-1 shards the optimizer states over the {world} GPUs",
    Rung.CHUNKED_LOSS: "the chunked loss computes the output head and cross-entropy a few thousand tokens at a "
                       "time, so the tokens x vocabulary logits are never built whole",
    Rung.ZERO2: "ZeRO-2 shards the optimizer states and gradients over the {world} GPUs",
    Rung.MICRO_BATCH: "micro-batch {mb} with {acc} accumulation steps keeps the effective batch of {eff}",
    Rung.GRADIENT_CHECKPOINTING: "gradient checkpointing keeps only each layer's input and recomputes the rest",
    Rung.ACTIVATION_OFFLOADING: "activation offloading holds the checkpointed layer inputs in CPU RAM",
    Rung.ZERO3: "ZeRO-3 shards the optimizer states, gradients and parameters (gathered layer by layer) over the "
                "{world} GPUs",
    Rung.OFFLOAD_OPTIMIZER: "optimizer states and the optimizer step move to CPU RAM",
    Rung.OFFLOAD_PARAMS: "parameters move to CPU RAM between uses",
    Rung.LORA: "LoRA trains small adapters instead of every weight (method.allow_method_change)",
    Rung.QLORA: "QLoRA stores the frozen base weights in 4 bits (method.allow_method_change)",
}


def reason(recipe, rung: Rung) -> str:
    """Why ``rung`` helps, in the words of ``recipe`` (the recipe after the climb)."""
    mem = recipe.memory
    line = REASONS[rung].format(world=recipe.world_size, mb=mem.micro_batch_size, acc=mem.gradient_accumulation_steps,
                                eff=mem.micro_batch_size * mem.gradient_accumulation_steps)
    if recipe.world_size == 1:
        line = line.replace(" over the 1 GPUs", " (on one GPU: what lets DeepSpeed offload)")
    if mem.distributed == "fsdp":
        line = line.replace("ZeRO-2", "FSDP shard_grad_op").replace("ZeRO-3", "FSDP full_shard")
    return line


def _reasons(recipe, changes: list[Rung], before: MemoryPlan, after: MemoryPlan) -> list[str]:
    lines = [reason(recipe, c) for c in dict.fromkeys(changes)]
    if recipe.objective.preference and Rung.LORA in changes:
        lines.append("with LoRA the reference is the model with its adapter disabled: no frozen copy")
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


def _overrides(recipe, candidate) -> list[str]:
    return recipe_changes(recipe, candidate) if candidate is not recipe else []


def advise(recipe, limit: int = 5) -> list[Advice]:
    """Plans that fit, cheapest first (at most ``limit``); or one non-fitting Advice saying how much is missing."""
    from tuner.recipe.checks import find_problems

    before = plan(recipe)
    base = tactics_of(recipe)
    machines = recipe.hardware.machines
    scored = []
    for tactics in _candidates(recipe):
        candidate = apply_tactics(recipe, tactics) if tactics != base else recipe
        if tactics != base and find_problems(candidate):
            continue  # e.g. 8-bit QLoRA with ZeRO-3, offload without sharding
        memory_plan = plan(candidate)
        changes = rungs_between(base, tactics, machines)
        scored.append((memory_plan.fits, _cost(changes), memory_plan.gpu.total_gib, tactics, candidate, memory_plan, changes))
    fitting = [s for s in sorted((s for s in scored if s[0]), key=lambda s: (s[1], s[2]))
               if s[4] is recipe or _runnable(s[4])]  # a rung can push a field past its limit (found by fuzzing)
    if not fitting:
        best = min(scored, key=lambda s: s[5].missing_gib)
        _, cost, _, _, candidate, memory_plan, changes = best
        limiting = memory_plan.limiting
        if limiting.kind == "host":
            fix = "set hardware.host_ram_gb to the machines' RAM, use machines with more"
        elif limiting.kind == "cpu":
            fix = "give the run more RAM (hardware.host_ram_gb), shorten max_seq_length, or train on a GPU"
        else:
            fix = "add GPUs, use larger ones, shorten max_seq_length"
        if not (recipe.method.allow_method_change or recipe.method.kind == "qlora"):
            fix += ", or set method.allow_method_change to allow LoRA/QLoRA"  # smaller in every phase
        why = (f"nothing fits on {limiting.name}: {memory_plan.missing_gib:.1f} GiB missing while {limiting.moment} "
               f"even with {rung_list(changes) or 'the recipe as is'}; {fix}.")
        return [Advice(candidate, memory_plan, cost, [why] + _reasons(candidate, changes, before, memory_plan), changes,
                       overrides=_overrides(recipe, candidate))]
    advice = []
    seen_configs = set()
    for _, cost, _, tactics, candidate, memory_plan, changes in fitting:
        key = replace(tactics, micro_batch=0)
        if key in seen_configs:  # the same tactics with a smaller micro-batch: only the cheapest
            continue
        seen_configs.add(key)
        finished = candidate if candidate is recipe else _finish(candidate)
        reasons = _reasons(finished, changes, before, memory_plan) or [f"fits as is ({memory_plan.verdict})"]
        advice.append(Advice(finished, memory_plan, cost, reasons, changes, overrides=_overrides(recipe, finished)))
        if len(advice) == limit:
            break
    chosen = advice[0]
    found = largest_micro_batch(chosen.recipe)
    if found:
        chosen.largest_micro_batch, chosen.accumulation_for_largest = found
    return advice


@dataclass(frozen=True)
class Step:
    """The next rung of the ladder as the recipe it leads to (for an out-of-memory handler)."""

    rung: Rung
    recipe: object  # validated
    overrides: list[str]  # the --set lines that turn the recipe as given into ``recipe``
    reason: str


def next_step(recipe) -> Step | None:
    """The cheapest rung the recipe has not climbed whose result is a valid recipe, or None at the top of the ladder.

    The rungs are tried in ladder order (:data:`tuner.recipe.tactics.LADDER`); what each changes comes from
    :func:`tuner.recipe.tactics.climb` and :func:`~tuner.recipe.tactics.apply_tactics`, and whether the result may
    run from :func:`tuner.recipe.checks.find_problems`, so nothing here re-spells a rule.
    """
    from tuner.recipe.checks import find_problems

    for rung in LADDER:
        tactics = climb(recipe, rung)
        if tactics is None:
            continue
        candidate = apply_tactics(recipe, tactics)
        if find_problems(candidate) or not _runnable(candidate):
            continue
        finished = _finish(candidate)
        return Step(rung, finished, recipe_changes(recipe, finished), reason(finished, rung))
    return None
