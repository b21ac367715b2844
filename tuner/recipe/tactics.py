"""The memory tactics a recipe can climb (the rungs of the advisor's ladder): their names, and what each changes.

One place for both: the advisor (:mod:`tuner.planner.advisor`) prices, searches and explains the rungs, the
out-of-memory advice (:mod:`tuner.train.oom`) shows the advisor's next rung as ``--set`` lines made by
:func:`recipe_changes`, and the shipped Accelerate presets (:mod:`tuner.render.presets`) are recipes that
climbed named rungs.  A rung is never spelled as recipe fields anywhere else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from tuner.recipe.schema import Recipe


class Rung(str, Enum):
    """The ladder, cheapest first: the order in which an out-of-memory run climbs it."""

    def __str__(self) -> str:  # the name users read and type, as enum.StrEnum (Python 3.11+) would print it
        return self.value

    PRECOMPUTE_REFERENCE = "precompute_reference"  # dpo/kto: reference log-probabilities before training, no copy
    SMALLER_ROUNDS = "smaller_rounds"  # grpo: halve steps_per_generation: fewer completions generated at once
    VLLM_SLEEP = "vllm_sleep"  # grpo with colocated vLLM: its memory freed during the training step
    ZERO1 = "zero1"  # shard the optimizer states
    CHUNKED_LOSS = "chunked_loss"  # never build the tokens x vocabulary logits
    ZERO2 = "zero2"  # shard the gradients too
    MICRO_BATCH = "micro_batch"  # halve the micro-batch, double the accumulation
    GRADIENT_CHECKPOINTING = "gradient_checkpointing"  # keep each layer's input, recompute the rest
    ACTIVATION_OFFLOADING = "activation_offloading"  # hold the checkpointed inputs in CPU RAM
    ZERO3 = "zero3"  # shard the parameters too
    TENSOR_PARALLEL = "tensor_parallelism"  # per doubling of tp: split every layer's weights across GPUs of a machine
    CONTEXT_PARALLEL = "context_parallelism"  # per doubling of cp (fsdp) or sp (deepspeed): split each sequence
    EXPERT_PARALLEL = "expert_parallelism"  # per doubling of ep (fsdp, MoE): each rank holds and runs its own experts
    OFFLOAD_OPTIMIZER = "offload_optimizer"  # optimizer states and step in CPU RAM
    OFFLOAD_PARAMS = "offload_params"  # parameter shards in CPU RAM
    NO_REFERENCE = "no_reference"  # grpo: beta 0, no KL penalty and no reference model (method.allow_method_change)
    LORA = "lora"  # train adapters instead of every weight (method.allow_method_change)
    QLORA = "qlora"  # and quantise the frozen base to 4 bits


LADDER = tuple(Rung)
SHARDING_RUNGS = (Rung.ZERO1, Rung.ZERO2, Rung.ZERO3)  # sharding level 1, 2, 3
# Rungs after which a run can resume from its checkpoints: the layout of weights and optimizer states is unchanged
# Rungs that change which ranks share a batch (the effective batch is kept by more accumulation, the checkpoints are
# laid out anew): the advisor proposes them where its plans show them cheapest; an out-of-memory run does not climb them
LAYOUT_RUNGS = (Rung.TENSOR_PARALLEL, Rung.CONTEXT_PARALLEL, Rung.EXPERT_PARALLEL)
KEEPS_CHECKPOINTS = frozenset({Rung.MICRO_BATCH, Rung.GRADIENT_CHECKPOINTING, Rung.ACTIVATION_OFFLOADING,
                               Rung.CHUNKED_LOSS, Rung.PRECOMPUTE_REFERENCE, Rung.SMALLER_ROUNDS, Rung.VLLM_SLEEP,
                               Rung.NO_REFERENCE})


@dataclass(frozen=True)
class Tactics:
    """The knobs the ladder turns, read from a recipe (:func:`tactics_of`) or applied to one (:func:`apply_tactics`)."""

    sharding: str  # none, ddp, zero0..zero3, fsdp:<strategy>
    checkpointing: bool
    offload_optimizer: str
    offload_params: str
    micro_batch: int
    method: str
    chunked_loss: bool = False
    activation_offloading: bool = False
    precompute_reference: bool = False  # dpo/kto: objective.precompute_ref_log_probs
    tp: int = 1  # parallelism.tp
    seq_shards: int = 1  # parallelism.cp under fsdp, parallelism.sp under deepspeed
    round_steps: int = 1  # grpo: objective.grpo.steps_per_generation
    vllm_sleep: bool = False  # grpo: objective.grpo.vllm_sleep_mode
    no_reference: bool = False  # grpo: objective.beta is 0
    ep: int = 1  # parallelism.ep


def tactics_of(recipe: Recipe) -> Tactics:
    mem = recipe.memory
    if mem.distributed == "deepspeed":
        sharding = f"zero{mem.zero_stage}"
    elif mem.distributed == "fsdp":
        sharding = f"fsdp:{mem.fsdp.sharding_strategy}"
    else:
        sharding = mem.distributed
    grpo = recipe.objective.grpo
    rollout = dict(round_steps=grpo.steps_per_generation, vllm_sleep=grpo.vllm_sleep_mode,
                   no_reference=not recipe.objective.beta) if grpo else {}
    return Tactics(sharding, mem.gradient_checkpointing, mem.offload_optimizer, mem.offload_params,
                   recipe.training.micro_batch_size, recipe.method.kind, mem.chunked_loss, mem.activation_offloading,
                   recipe.objective.precompute_ref_log_probs, recipe.parallelism.tp,
                   recipe.parallelism.cp * recipe.parallelism.sp, **rollout, ep=recipe.parallelism.ep)


_FSDP_LEVEL = {"no_shard": 0.0, "shard_grad_op": 2.0, "full_shard": 3.0}


def sharding_level(sharding: str, machines: int = 1) -> float:
    """What a sharding shards: 0 nothing, 1 optimizer states, 2 and gradients, 3 and parameters.

    FSDP's hybrid_shard shards within a machine: full sharding on one machine, between 2 and 3 on several.
    """
    if sharding.startswith("zero"):
        return float(sharding[-1])
    if sharding.startswith("fsdp:"):
        strategy = sharding.split(":")[1]
        return _FSDP_LEVEL.get(strategy, 3.0 if machines == 1 else 2.5)
    return 0.0


def sharding_rung(level: float) -> Rung:
    return SHARDING_RUNGS[math.ceil(level) - 1]


def rungs_between(base: Tactics, tactics: Tactics, machines: int = 1) -> list[Rung]:
    """The rungs ``tactics`` climbs above ``base``, in ladder order (each sharding includes the ones below it)."""
    rungs = []
    if sharding_level(tactics.sharding, machines) > sharding_level(base.sharding, machines):
        rungs.append(sharding_rung(sharding_level(tactics.sharding, machines)))
    for rung, field in ((Rung.GRADIENT_CHECKPOINTING, "checkpointing"), (Rung.CHUNKED_LOSS, "chunked_loss"),
                        (Rung.ACTIVATION_OFFLOADING, "activation_offloading"),
                        (Rung.PRECOMPUTE_REFERENCE, "precompute_reference"), (Rung.VLLM_SLEEP, "vllm_sleep"),
                        (Rung.NO_REFERENCE, "no_reference")):
        if getattr(tactics, field) and not getattr(base, field):
            rungs.append(rung)
    for rung in (Rung.OFFLOAD_OPTIMIZER, Rung.OFFLOAD_PARAMS):
        if getattr(tactics, rung.value) != "none" and getattr(base, rung.value) == "none":
            rungs.append(rung)
    for rung, field in ((Rung.TENSOR_PARALLEL, "tp"), (Rung.CONTEXT_PARALLEL, "seq_shards"),
                        (Rung.EXPERT_PARALLEL, "ep")):
        if getattr(tactics, field) > getattr(base, field):
            rungs += [rung] * int(round(math.log2(getattr(tactics, field) / getattr(base, field))))
    if tactics.micro_batch < base.micro_batch:
        rungs += [Rung.MICRO_BATCH] * int(round(math.log2(base.micro_batch / tactics.micro_batch)))
    if tactics.round_steps < base.round_steps:
        rungs += [Rung.SMALLER_ROUNDS] * int(round(math.log2(base.round_steps / tactics.round_steps)))
    if tactics.method != base.method:
        rungs += {("full", "lora"): [Rung.LORA], ("lora", "qlora"): [Rung.QLORA],
                  ("full", "qlora"): [Rung.LORA, Rung.QLORA]}[(base.method, tactics.method)]
    return sorted(rungs, key=LADDER.index)


def climb(recipe: Recipe, rung: Rung) -> Tactics | None:
    """The recipe's tactics one ``rung`` higher, or None where the rung is climbed already or changes nothing here.

    Whether the result is a valid recipe is for :func:`tuner.recipe.checks.find_problems` to say.
    """
    t = tactics_of(recipe)
    if rung in LAYOUT_RUNGS:
        return None
    machines, multi = recipe.hardware.machines, recipe.world_size > 1 and recipe.uses_gpu
    fsdp = t.sharding.startswith("fsdp:")
    if rung in SHARDING_RUNGS:
        level = SHARDING_RUNGS.index(rung) + 1
        if sharding_level(t.sharding, machines) >= level or not recipe.uses_gpu:
            return None
        if level < 3 and not multi:
            return None  # one GPU: only ZeRO-3 changes anything (it is what lets DeepSpeed offload)
        if fsdp:
            return None if level == 1 else replace(t, sharding="fsdp:shard_grad_op" if level == 2 else "fsdp:full_shard")
        return replace(t, sharding=rung.value)
    if rung == Rung.MICRO_BATCH:
        return replace(t, micro_batch=t.micro_batch // 2) if t.micro_batch > 1 else None
    grpo = recipe.objective.grpo
    if rung == Rung.SMALLER_ROUNDS:  # whole groups in every round: for the checks to say
        return replace(t, round_steps=t.round_steps // 2) if grpo and t.round_steps > 1 else None
    if rung == Rung.VLLM_SLEEP:
        useful = grpo and grpo.generation == "vllm_colocate" and not t.vllm_sleep
        return replace(t, vllm_sleep=True) if useful else None
    if rung == Rung.NO_REFERENCE:  # changes what is learned: only with the recipe's permission
        useful = grpo and not t.no_reference and recipe.method.allow_method_change
        return replace(t, no_reference=True) if useful else None
    if rung == Rung.PRECOMPUTE_REFERENCE:  # LoRA keeps no reference copy: its disabled adapter is the reference
        useful = recipe.objective.preference and t.method == "full" and not t.precompute_reference
        return replace(t, precompute_reference=True) if useful else None
    if rung in (Rung.GRADIENT_CHECKPOINTING, Rung.CHUNKED_LOSS, Rung.ACTIVATION_OFFLOADING):
        field = "checkpointing" if rung == Rung.GRADIENT_CHECKPOINTING else rung.value
        return None if getattr(t, field) else replace(t, **{field: True})
    if rung in (Rung.OFFLOAD_OPTIMIZER, Rung.OFFLOAD_PARAMS):
        needed = 1 if rung == Rung.OFFLOAD_OPTIMIZER else 3
        if getattr(t, rung.value) != "none" or not recipe.uses_gpu or sharding_level(t.sharding, machines) < needed:
            return None
        if fsdp:  # FSDP offloads parameters, gradients and optimizer states together
            return replace(t, offload_optimizer="cpu", offload_params="cpu")
        return replace(t, **{rung.value: "cpu"})
    if not recipe.method.allow_method_change:
        return None
    wanted = {Rung.LORA: ("full", "lora"), Rung.QLORA: ("lora", "qlora")}[rung]
    return replace(t, method=wanted[1]) if t.method == wanted[0] else None


def apply_tactics(recipe: Recipe, t: Tactics) -> Recipe:
    """The recipe with tactics ``t``, keeping the effective batch (not yet validated)."""
    mem, method = recipe.memory, recipe.method
    data_parallel = max(1, recipe.world_size // (t.tp * t.seq_shards))
    update = {"gradient_checkpointing": t.checkpointing, "offload_optimizer": t.offload_optimizer,
              "offload_params": t.offload_params, "chunked_loss": t.chunked_loss,
              "activation_offloading": t.activation_offloading}
    training = {"micro_batch_size": t.micro_batch,
                "gradient_accumulation_steps": max(1, math.ceil(recipe.effective_batch_size
                                                                / (t.micro_batch * data_parallel)))}
    if t.sharding.startswith("zero"):
        update.update(distributed="deepspeed", zero_stage=int(t.sharding[-1]))
        if recipe.training.optimizer not in ("adamw_torch", "adamw_torch_fused"):
            training["optimizer"] = "adamw_torch"  # DeepSpeed brings its own optimizer
    elif t.sharding.startswith("fsdp:"):
        update.update(distributed="fsdp", zero_stage=None,
                      fsdp=mem.fsdp.model_copy(update={"sharding_strategy": t.sharding.split(":")[1]}))
    else:
        update.update(distributed=t.sharding, zero_stage=None)
    changes = {"memory": mem.model_copy(update=update), "training": recipe.training.model_copy(update=training)}
    if (t.tp, t.seq_shards, t.ep) != (recipe.parallelism.tp, recipe.parallelism.cp * recipe.parallelism.sp,
                                      recipe.parallelism.ep):
        changes["parallelism"] = _layout(recipe, t, update["distributed"])
    if t.precompute_reference != recipe.objective.precompute_ref_log_probs:
        changes["objective"] = recipe.objective.model_copy(update={"precompute_ref_log_probs": t.precompute_reference})
    grpo = recipe.objective.grpo
    if grpo and (t.round_steps, t.vllm_sleep, t.no_reference) != (grpo.steps_per_generation, grpo.vllm_sleep_mode,
                                                                   not recipe.objective.beta):
        rollout = grpo.model_copy(update={"steps_per_generation": t.round_steps, "vllm_sleep_mode": t.vllm_sleep})
        beta = 0.0 if t.no_reference else recipe.objective.beta
        changes["objective"] = changes.get("objective", recipe.objective).model_copy(
            update={"grpo": rollout, "beta": beta})
    if t.method != method.kind:
        quant = method.quantization
        if t.method == "qlora" and quant is None:
            from tuner.recipe.schema import QuantizationSection

            quant = QuantizationSection()
        update = {"kind": t.method, "quantization": quant if t.method == "qlora" else None}
        if method.kind == "full" and method.lora.dropout and _adapts_fused_experts(recipe):
            update["lora"] = method.lora.model_copy(update={"dropout": 0.0})  # PEFT wraps fused experts only so
        changes["method"] = method.model_copy(update=update)
        if recipe.output.save == "full" and t.method != "full":
            changes["output"] = recipe.output.model_copy(update={"save": "adapter"})
    return recipe.model_copy(update=changes)


def _adapts_fused_experts(recipe: Recipe) -> bool:
    """Whether the recipe's LoRA targets make PEFT adapt fused experts as parameters (lora.ParamWrapper), which it
    refuses with dropout: a switch to LoRA then sets dropout 0 rather than propose a recipe the checks refuse."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    lora, model = recipe.method.lora, recipe.model
    try:
        return model_facts(model.id, model.revision, model.trust_remote_code).adapts_parameters(
            lora.target_modules, lora.target_parameters)
    except UnknownModelError:
        return False


def _layout(recipe: Recipe, t: Tactics, distributed: str):
    """The parallelism section for tactics ``t``: fsdp splits sequences with cp and lays out dp_replicate x dp_shard
    (the recipe's replication kept), deepspeed with sp and shards ZeRO over the rest."""
    par = recipe.parallelism
    if distributed != "fsdp":
        return par.model_copy(update={"tp": t.tp, "cp": 1, "sp": t.seq_shards, "ep": t.ep, "dp_replicate": None,
                                      "dp_shard": None})
    if t.tp == 1 and t.seq_shards == 1 and t.ep == 1:
        return par.model_copy(update={"tp": 1, "cp": 1, "sp": 1, "ep": 1, "dp_replicate": None, "dp_shard": None})
    replicate = par.dp_replicate or 1
    return par.model_copy(update={"tp": t.tp, "cp": t.seq_shards, "sp": 1, "ep": t.ep, "dp_replicate": replicate,
                                  "dp_shard": max(1, recipe.world_size // (replicate * t.tp * t.seq_shards))})


def recipe_changes(before: Recipe, after: Recipe) -> list[str]:
    """The ``--set`` assignments (``dotted.key=value``) that turn ``before`` into ``after``, in schema order.

    Each value is written so the override parser reads it back unchanged (JSON for non-strings, quoted
    strings where YAML would read something else).
    """
    import json

    import yaml

    def flat(data, prefix=""):
        for key, value in data.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    def written(value) -> str:
        if isinstance(value, str):
            try:
                plain = yaml.safe_load(value) == value
            except yaml.YAMLError:
                plain = False
            return value if plain else json.dumps(value)
        return json.dumps(value)

    old = dict(flat(before.model_dump(mode="json")))
    return [f"{key}={written(value)}" for key, value in flat(after.model_dump(mode="json")) if old.get(key) != value]
