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

from tuner.planner.items import MemoryPlan
from tuner.planner.memory import plan
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
    Rung.SMALLER_ROUNDS: 0.06,  # grpo, per halving: twice the generate calls, each on half the completions
    Rung.VLLM_SLEEP: 0.10,  # grpo: vLLM's weights to CPU RAM and back, its KV cache rebuilt, every round
    Rung.ZERO1: 0.02,  # same communication volume as DDP; a sharded step
    Rung.CHUNKED_LOSS: 0.03,  # the loss in token chunks: more, smaller kernels; no recomputation
    Rung.ZERO2: 0.05,  # reduce-scatter instead of all-reduce, a few more syncs
    Rung.MICRO_BATCH: 0.08,  # per halving: smaller matmuls use the GPU less well
    Rung.GRADIENT_CHECKPOINTING: 0.25,  # one extra forward of ~3 units of compute, partly hidden by lower memory traffic
    Rung.ACTIVATION_OFFLOADING: 0.15,  # the checkpointed inputs cross PCIe twice per step, on the compute stream
    Rung.ZERO3: 0.30,  # 1.5x DDP's communication volume and a gather before every module, rarely fully overlapped
    Rung.TENSOR_PARALLEL: 0.07,  # per doubling of tp: all-reduces inside every layer over NVLink, smaller matmuls
    Rung.CONTEXT_PARALLEL: 0.05,  # per doubling of cp/sp: KV exchange (ring) or all-to-all per layer, mostly overlapped
    Rung.EXPERT_PARALLEL: 0.10,  # per doubling of ep: two all-to-alls of k routed rows per token per MoE layer, each way
    Rung.OFFLOAD_OPTIMIZER: 0.60,  # optimizer step on the CPU and gradients over PCIe
    Rung.OFFLOAD_PARAMS: 1.20,  # every parameter crosses PCIe twice per step
    Rung.NO_REFERENCE: 0.9,  # grpo: faster (no reference forward), but drops the KL penalty: only when nothing else fits
    Rung.LORA: 1.0,  # not slower, but changes what is learned: only when nothing else fits
    Rung.QLORA: 1.6,  # dequantisation on every matmul, and quantised base weights
}
# ZeRO-3 (and FSDP's full sharding) on a mixture of experts gathers every expert of a layer on every rank before each
# use, though a token runs through k of them: ms-swift measured 91 s/it against Megatron's 9.6 on Qwen3-30B-A3B.
# Added to Rung.ZERO3, it ranks a replicated or quantised base before a sharded one wherever those fit.
MOE_FULL_SHARDING_COST = 2.0


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
    label: str = ""  # what it changes, in a few words (change_label); empty: nothing

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def summary(self) -> str:
        if not self.fits:
            return self.reasons[0]
        head = self.label or "as is"
        return f"{head}: {self.plan.gpu.total_gib:.1f} GiB of {self.plan.gpu.capacity_gib:.1f} GiB, ~{self.cost:.0%} slower"


# How a label names a field it sets (any other field: its own name); the fields that follow others by the schema's
# defaults (the save of a LoRA run, FSDP's data-parallel layout) are left out, as a recipe leaves them implicit.
_SHARDING_FIELDS = ("memory.distributed", "memory.zero_stage", "memory.fsdp.sharding_strategy")
_NAMES = {"training.micro_batch_size": "micro-batch", "training.gradient_accumulation_steps": "accumulation",
          "memory.offload_optimizer": "optimizer offload to", "memory.offload_params": "parameter offload to",
          "objective.precompute_ref_log_probs": "precomputed reference", "parallelism.tp": "tp",
          "parallelism.cp": "cp", "parallelism.sp": "sp", "parallelism.ep": "ep"}
_FOLLOWERS = ("output.save", "parallelism.dp_replicate", "parallelism.dp_shard", "method.quantization")


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def change_label(before, after) -> str:
    """What turns recipe ``before`` into ``after``, in a few words made from the fields that differ
    ('ZeRO-1 + sp 4 + accumulation 4'): the name of a proposal in ``tuner plan --advise`` and in the wizard's
    Auto-fit, so it always says what the proposal applies.  Empty when nothing differs."""
    old, new = _flat(before.model_dump(mode="json")), _flat(after.model_dump(mode="json"))
    changed = [key for key, value in new.items() if old.get(key) != value and not key.startswith(_FOLLOWERS)]
    words = []
    for key in changed:
        value = new[key]
        if key in _SHARDING_FIELDS:
            if key != next(field for field in changed if field in _SHARDING_FIELDS):
                continue  # one phrase for the three
            memory = after.memory
            words.append({"deepspeed": f"ZeRO-{memory.zero_stage}", "fsdp": f"FSDP {memory.fsdp.sharding_strategy}",
                          "ddp": "DDP", "none": "one process"}[memory.distributed])
        elif key == "method.kind":
            words.append({"lora": "LoRA", "qlora": "QLoRA"}.get(value, f"{value} fine-tuning"))
        else:
            name = _NAMES.get(key, key.rsplit(".", 1)[-1].replace("_", " "))
            if value is True:
                words.append(name)
            elif value in (False, "none"):
                words.append(f"no {name.removesuffix(' to')}")
            else:
                words.append(f"{name} {value}")
    return " + ".join(words)


def _cost(rungs: list[Rung], moe: bool = False, ep: int = 1) -> float:
    """The rungs' summed cost; full sharding of a MoE pays for gathering every expert unless ep keeps each rank's
    experts its own (it then gathers them only over the efsdp ranks that share them)."""
    surcharge = MOE_FULL_SHARDING_COST if moe and ep == 1 else 0.0
    return sum(RUNG_COST[r] + (surcharge if r is Rung.ZERO3 else 0.0) for r in rungs)


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
    batches = _halvings(base.micro_batch)
    methods = [base.method]
    if recipe.method.allow_method_change:
        methods += {"full": ["lora", "qlora"], "lora": ["qlora"], "qlora": []}[base.method]
    offload = ["none", "cpu"] if on_gpu else ["none"]
    # tensor parallelism within a machine, sequences split across the data-parallel ranks (doublings)
    tps = _doublings(base.tp, recipe.hardware.gpus_per_machine) if on_gpu and "full" in methods else [base.tp]
    seq_shards = _doublings(base.seq_shards, world) if on_gpu else [base.seq_shards]
    eps = _doublings(base.ep, world) if on_gpu and world > 1 and _has_ep_plan(recipe) else [base.ep]
    if len(eps) > 1 and not base.sharding.startswith("fsdp:"):
        shardings.append("fsdp:full_shard")  # ep runs under transformers' FSDP2: offered from any backend, with ep only

    def at_least(value, floor):  # a tactic the recipe already uses is kept
        return [v for v in value if v or not floor]

    # dpo/kto with full fine-tuning may drop the reference copy (LoRA needs none: its disabled adapter is the reference)
    precompute = at_least((False, True), base.precompute_reference) if recipe.objective.preference else [
        base.precompute_reference]  # sft has no reference model: the setting is inert, kept as the recipe says
    rollouts = [base]
    if recipe.objective.grpo:  # grpo: smaller generation rounds, vLLM asleep in the step, no reference (if allowed)
        grpo = recipe.objective.grpo
        rounds = _halvings(base.round_steps)
        sleeps = at_least((False, True), base.vllm_sleep) if grpo.generation == "vllm_colocate" else [base.vllm_sleep]
        references = at_least((False, True), base.no_reference) if recipe.method.allow_method_change else [
            base.no_reference]
        rollouts = [replace(base, round_steps=k, vllm_sleep=sleep, no_reference=no_ref)
                    for k, sleep, no_ref in product(rounds, sleeps, references)]

    out = []
    for sharding, ckpt, act_off, chunked, opt_off, par_off, mb, meth, pre, tp, shards, rollout, ep in product(
            shardings, at_least((False, True), base.checkpointing), at_least((False, True) if on_gpu else (False,),
                                                                              base.activation_offloading),
            at_least((False, True), base.chunked_loss), offload, offload, batches, methods, precompute, tps,
            seq_shards, rollouts, eps):
        if ep > 1 and (not sharding.startswith("fsdp:") or meth != "full" or shards > 1 or chunked or ep % tp):
            continue  # ep: fsdp, full weights, no cp, a multiple of tp (the checks refuse the rest)
        if ep == 1 and sharding.startswith("fsdp:") and not base.sharding.startswith("fsdp:"):
            continue  # FSDP offered to a DeepSpeed or DDP recipe only for ep
        if act_off and not ckpt:
            continue  # offloading holds the checkpointed inputs
        if world % (tp * shards) or (tp > 1 and (meth != "full" or chunked)):
            continue  # the checks refuse these; skipped here so the search stays small
        if recipe.objective.grpo and (chunked or tp * shards > 1):
            continue  # grpo: TRL's fused head, data parallelism only (refused too)
        if pre and not base.precompute_reference and meth != "full":
            continue
        if (base.offload_optimizer != "none" and opt_off == "none") or (base.offload_params != "none" and par_off == "none"):
            continue
        if opt_off != "none" and base.offload_optimizer != "none":
            opt_off = base.offload_optimizer
        if par_off != "none" and base.offload_params != "none":
            par_off = base.offload_params
        out.append(Tactics(sharding, ckpt, opt_off, par_off, mb, meth, chunked, act_off, pre, tp, shards,
                           rollout.round_steps, rollout.vllm_sleep, rollout.no_reference, ep))
    return list(dict.fromkeys(out))


def _has_ep_plan(recipe) -> bool:
    """A MoE model transformers can shard by expert (its config's base_model_ep_plan): where the ep rung applies."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts
    from tuner.recipe.expert_checks import model_ep_plan

    try:
        facts = model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code)
    except UnknownModelError:
        return False
    return facts.is_moe and bool(model_ep_plan(facts.model_type))


def _halvings(start: int) -> list[int]:
    """``start`` and its halvings down to 1: the micro-batches (or generation rounds) the advisor tries."""
    values = [start]
    while values[-1] > 1:
        values.append(values[-1] // 2)
    return values


def _doublings(start: int, most: int) -> list[int]:
    """``start`` and its doublings up to ``most``: the tp or cp/sp degrees the advisor tries."""
    values = [start]
    while values[-1] * 2 <= most:
        values.append(values[-1] * 2)
    return values


# Why each rung helps, said once: the advice, the plan's reasons and the out-of-memory message all use it.
REASONS = {
    Rung.PRECOMPUTE_REFERENCE: "the reference model's log-probabilities are computed in one pass before training, so "
                               "no frozen copy of the model stays beside it (objective.precompute_ref_log_probs)",
    Rung.SMALLER_ROUNDS: "steps_per_generation {rounds} generates {round} completions at a time per device instead "
                         "of a whole optimizer step's, in more, smaller rounds (the same samples, on-policy)",
    Rung.VLLM_SLEEP: "vLLM's sleep mode frees its share of the GPU during the training step (its weights wait in "
                     "CPU RAM; objective.grpo.vllm_sleep_mode)",
    Rung.ZERO1: "ZeRO-1 shards the optimizer states over the {world} GPUs",
    Rung.CHUNKED_LOSS: "the chunked loss computes the output head and cross-entropy a few thousand tokens at a "
                       "time, so the tokens x vocabulary logits are never built whole",
    Rung.ZERO2: "ZeRO-2 shards the optimizer states and gradients over the {world} GPUs",
    Rung.MICRO_BATCH: "micro-batch {mb} with {acc} accumulation steps keeps the effective batch of {eff}",
    Rung.GRADIENT_CHECKPOINTING: "gradient checkpointing keeps only each layer's input and recomputes the rest",
    Rung.ACTIVATION_OFFLOADING: "activation offloading holds the checkpointed layer inputs in CPU RAM",
    Rung.ZERO3: "ZeRO-3 shards the optimizer states, gradients and parameters (gathered layer by layer) over the "
                "{world} GPUs",
    Rung.TENSOR_PARALLEL: "tensor parallelism (tp {tp}) splits every layer's weights, gradients, optimizer states and "
                          "attention and MLP activations across {tp} GPUs of a machine; {acc} accumulation steps keep "
                          "the effective batch of {batch}",
    Rung.CONTEXT_PARALLEL: "{split} splits each sequence across {shards} GPUs, so each holds 1/{shards} of the "
                           "activations; {acc} accumulation steps keep the effective batch of {batch}",
    Rung.EXPERT_PARALLEL: "expert parallelism (ep {ep}) gives each GPU 1/{ep} of every layer's experts and sends "
                          "the routed tokens to them all-to-all, so full sharding no longer gathers every expert "
                          "of a layer on every GPU",
    Rung.OFFLOAD_OPTIMIZER: "optimizer states and the optimizer step move to CPU RAM",
    Rung.OFFLOAD_PARAMS: "parameters move to CPU RAM between uses",
    Rung.NO_REFERENCE: "beta 0 drops the KL penalty, so no reference model is loaded or run (it changes what is "
                       "learned; method.allow_method_change)",
    Rung.LORA: "LoRA trains small adapters instead of every weight (method.allow_method_change)",
    Rung.QLORA: "QLoRA stores the frozen base weights in 4 bits (method.allow_method_change)",
}


def reason(recipe, rung: Rung) -> str:
    """Why ``rung`` helps, in the words of ``recipe`` (the recipe after the climb)."""
    mem, par = recipe.memory, recipe.parallelism
    split = f"context parallelism (cp {par.cp}, ring attention)" if par.cp > 1 else \
        f"sequence parallelism (sp {par.sp}, DeepSpeed Ulysses)"
    rounds = recipe.objective.grpo.steps_per_generation if recipe.objective.grpo else 1
    line = REASONS[rung].format(world=recipe.world_size, mb=recipe.training.micro_batch_size, acc=recipe.training.gradient_accumulation_steps,
                                eff=recipe.training.micro_batch_size * recipe.training.gradient_accumulation_steps,
                                batch=recipe.effective_batch_size, tp=par.tp, shards=par.cp * par.sp, split=split,
                                ep=par.ep,
                                rounds=rounds, round=recipe.training.micro_batch_size * rounds)
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


def validated(recipe):
    """Validate a candidate fully (schema and cross-field rules) so it is a recipe tuner can run."""
    from tuner.recipe.io import validate_recipe

    return validate_recipe(recipe.model_dump(mode="json"))


def _runnable(candidate) -> bool:
    """Whether a candidate passes validation (e.g. accumulation within its limit of 65536)."""
    from tuner.recipe.source import RecipeError

    try:
        validated(candidate)
    except RecipeError:
        return False
    return True


def largest_micro_batch(recipe, limit: int = 4096) -> tuple[int, int] | None:
    """The largest micro-batch that still fits, and the accumulation that keeps the recipe's effective batch."""
    effective = recipe.training.micro_batch_size * recipe.training.gradient_accumulation_steps

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
    training = recipe.training.model_copy(update={"micro_batch_size": mb,
                                                  "gradient_accumulation_steps": max(1, math.ceil(effective / mb))})
    return recipe.model_copy(update={"training": training})


def override_lines(recipe, candidate) -> list[str]:
    """The --set lines that turn ``recipe`` into ``candidate`` (none for the recipe itself)."""
    return recipe_changes(recipe, candidate) if candidate is not recipe else []


def search_plans(recipe, keep=None) -> tuple[list[tuple], list[tuple]]:
    """(every candidate planned, those that fit and may run, cheapest first); ``keep`` limits the tactics tried."""
    from tuner.recipe.checks import find_problems

    from tuner.catalog.models import model_facts

    base = tactics_of(recipe)
    machines = recipe.hardware.machines
    moe = model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code).is_moe
    scored = []
    for tactics in _candidates(recipe):
        if keep is not None and not keep(base, tactics):
            continue
        candidate = apply_tactics(recipe, tactics) if tactics != base else recipe
        if tactics != base and find_problems(candidate):
            continue  # e.g. 8-bit QLoRA with ZeRO-3, offload without sharding
        memory_plan = plan(candidate)
        changes = rungs_between(base, tactics, machines)
        scored.append((memory_plan.fits, _cost(changes, moe, tactics.ep), memory_plan.gpu.total_gib, tactics, candidate, memory_plan, changes))
    fitting = [s for s in sorted((s for s in scored if s[0]), key=lambda s: (s[1], s[2]))
               if s[4] is recipe or _runnable(s[4])]  # a rung can push a field past its limit (found by fuzzing)
    return scored, fitting


def advise(recipe, limit: int = 5, host_ram_gib: float | None = None) -> list[Advice]:
    """Plans that fit, cheapest first (at most ``limit``); or one non-fitting Advice saying how much is missing.

    Host RAM is a capacity like a GPU's: where the machines' RAM is known (``hardware.host_ram_gb``, else
    ``host_ram_gib``: the wizard passes this machine's), no plan needing more of it is proposed (offloading 462 GiB
    of a MoE model's states to machines of 24 GiB is not a plan).  The advice keeps the recipe's own hardware
    section; its plans are made against that RAM."""
    if host_ram_gib is not None and recipe.hardware.host_ram_gb is None:
        known = recipe.model_copy(update={"hardware": recipe.hardware.model_copy(update={"host_ram_gb": host_ram_gib})})
        return [replace(advice, recipe=advice.recipe.model_copy(update={"hardware": advice.recipe.hardware.model_copy(
            update={"host_ram_gb": None})})) for advice in advise(known, limit)]
    before = plan(recipe)
    if before.unmodelled:  # every candidate has the same parts no term covers: nothing to rank
        return [Advice(recipe, before, 0.0, [f"no plan can be judged: tuner has no memory terms for "
                                             f"{'; '.join(before.unmodelled)}."])]
    scored, fitting = search_plans(recipe)
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
        label = change_label(recipe, candidate)
        why = (f"nothing fits on {limiting.name}: {memory_plan.missing_gib:.1f} GiB missing while {limiting.moment} "
               f"even with {label or 'the recipe as is'}; {fix}.")
        return [Advice(candidate, memory_plan, cost, [why] + _reasons(candidate, changes, before, memory_plan), changes,
                       overrides=override_lines(recipe, candidate), label=label)]
    advice = []
    seen_configs = set()
    for _, cost, _, tactics, candidate, memory_plan, changes in fitting:
        key = replace(tactics, micro_batch=0)
        if key in seen_configs:  # the same tactics with a smaller micro-batch: only the cheapest
            continue
        seen_configs.add(key)
        finished = candidate if candidate is recipe else validated(candidate)
        reasons = _reasons(finished, changes, before, memory_plan) or [f"fits as is ({memory_plan.verdict})"]
        advice.append(Advice(finished, memory_plan, cost, reasons, changes, overrides=override_lines(recipe, finished),
                             label=change_label(recipe, finished)))
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
        finished = validated(candidate)
        return Step(rung, finished, recipe_changes(recipe, finished), reason(finished, rung))
    return None
