"""Cross-field rules of a recipe, grouped by topic.

Each rule names the one field a user should change and says how, so a
conflict is reported at that field's line rather than at the top of the file.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog.gpus import AmbiguousGpuError, known_gpu_names, lookup_gpu
from tuner.catalog.models import custom_code
from tuner.recipe.schema import GRPO_LOSS_TYPES, LOSS_TYPES, OBJECTIVE_DATA, Recipe


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    anchor: str | None = None  # key whose line to show when ``field`` itself is not in the file


def _topology(recipe: Recipe) -> list[Problem]:
    hw = recipe.hardware
    problems = []
    if hw.gpus_per_machine and hw.num_processes != hw.machines * hw.gpus_per_machine:
        problems.append(Problem(
            "hardware.num_processes",
            f"{hw.num_processes} processes do not match {hw.machines} machine(s) x {hw.gpus_per_machine} GPU(s) = "
            f"{hw.machines * hw.gpus_per_machine}; remove num_processes or make it equal machines x gpus_per_machine.",
        ))
    if not hw.gpus_per_machine and hw.machines > 1 and hw.num_processes != hw.machines:
        # tested: one gloo process per machine (tests/test_multi_machine.py); several per machine are not
        problems.append(Problem(
            "hardware.num_processes",
            f"on the CPU a run on {hw.machines} machines starts one process on each: set num_processes to "
            f"{hw.machines} (or remove it), or use machines: 1 for several processes on one machine."))
    if not hw.gpus_per_machine and hw.machines > 1 and recipe.memory.distributed == "deepspeed":
        problems.append(Problem(
            "memory.distributed",
            f"on the CPU a run on {hw.machines} machines is tested with ddp only: set distributed: ddp, or use "
            "GPUs (hardware.gpus_per_machine) for deepspeed across machines."))
    if hw.machines > 1 and not hw.main_process_ip:
        problems.append(Problem(
            "hardware.main_process_ip", f"{hw.machines} machines need the address of machine rank 0 in hardware.main_process_ip.",
            anchor="hardware.machines"))
    if hw.gpus_per_machine and hw.gpu is None and hw.gpu_memory_gb is None:
        problems.append(Problem(
            "hardware.gpu", "say which GPU this is (e.g. gpu: A100-80GB or gpu: 24GB) or set hardware.gpu_memory_gb.",
            anchor="hardware.gpus_per_machine"))
    if hw.gpu is not None:
        try:
            lookup_gpu(hw.gpu)
        except AmbiguousGpuError as exc:
            problems.append(Problem("hardware.gpu", str(exc)))
        except KeyError:
            problems.append(Problem(
                "hardware.gpu",
                f"unknown GPU {hw.gpu!r}; use one of {', '.join(known_gpu_names())} or a size such as '48GB'."))
    if recipe.world_size > 1 and recipe.memory.distributed == "none":
        problems.append(Problem(
            "memory.distributed",
            f"{recipe.world_size} processes need a way to share the work: set distributed to ddp, deepspeed or fsdp."))
    return problems


def _sharding(recipe: Recipe) -> list[Problem]:
    mem, hw = recipe.memory, recipe.hardware
    problems = []
    if mem.distributed == "deepspeed" and mem.zero_stage is None:
        problems.append(Problem("memory.zero_stage", "distributed: deepspeed needs a ZeRO stage: set zero_stage to 0, 1, 2 or 3.",
                                anchor="memory.distributed"))
    if mem.distributed != "deepspeed" and mem.zero_stage is not None:
        if mem.distributed == "fsdp":
            message = "deepspeed and fsdp cannot be used together: remove zero_stage, or set distributed: deepspeed."
        else:
            message = "zero_stage is a DeepSpeed setting: set distributed: deepspeed, or remove zero_stage."
        problems.append(Problem("memory.zero_stage", message))
    if mem.distributed == "fsdp" and not hw.gpus_per_machine:
        problems.append(Problem(
            "memory.distributed", "FSDP needs GPUs (on the CPU Accelerate silently falls back to DDP); use ddp or deepspeed."))

    if mem.distributed == "fsdp" and mem.fsdp.sharding_strategy == "no_shard":
        problems.append(Problem(
            "memory.fsdp.sharding_strategy",
            "FSDP2 has no no_shard mode (replicating everything is DDP): use distributed: ddp, or full_shard, "
            "shard_grad_op or hybrid_shard."))

    sharded_optimizer = (mem.distributed == "deepspeed" and (mem.zero_stage or 0) >= 1) or mem.distributed == "fsdp"
    if mem.offload_optimizer != "none" and not sharded_optimizer:
        problems.append(Problem(
            "memory.offload_optimizer",
            "offload needs ZeRO or FSDP: set distributed: deepspeed with zero_stage 1-3 (or fsdp), or set offload_optimizer: none."))
    params_shardable = (mem.distributed == "deepspeed" and mem.zero_stage == 3) or mem.distributed == "fsdp"
    if mem.offload_params != "none" and not params_shardable:
        problems.append(Problem(
            "memory.offload_params",
            "parameter offload needs ZeRO-3 or FSDP: set distributed: deepspeed with zero_stage: 3 (or fsdp), or offload_params: none."))
    for field in ("offload_optimizer", "offload_params"):
        value = getattr(mem, field)
        if value == "nvme" and mem.distributed == "fsdp":
            problems.append(Problem(f"memory.{field}", "FSDP can offload to cpu only; use cpu, or DeepSpeed ZeRO-3 for nvme."))
        elif value == "nvme" and not hw.nvme_path:
            problems.append(Problem(f"memory.{field}", "nvme offload needs a directory: set hardware.nvme_path."))
        elif value == "nvme" and mem.zero_stage != 3:
            problems.append(Problem(f"memory.{field}", "nvme offload (ZeRO-Infinity) needs zero_stage: 3."))
    if mem.distributed == "fsdp" and mem.offload_optimizer != mem.offload_params and "nvme" not in (mem.offload_optimizer, mem.offload_params):
        problems.append(Problem(
            "memory.offload_params",
            "FSDP offloads parameters, gradients and optimizer states together: set offload_params and offload_optimizer to the same value."))
    return problems


def _method(recipe: Recipe) -> list[Problem]:
    method, mem = recipe.method, recipe.memory
    problems = []
    if method.kind == "qlora" and method.quantization is None:
        problems.append(Problem(
            "method.quantization", "qlora needs 4- or 8-bit settings: add quantization: {bits: 4} (or bits: 8).",
            anchor="method.kind"))
    if method.kind != "qlora" and method.quantization is not None:
        problems.append(Problem(
            "method.quantization",
            f"quantised weights cannot be trained directly with {method.kind}: use kind: qlora, or remove quantization."))
    if method.kind == "qlora" and mem.offload_params != "none":
        problems.append(Problem(
            "memory.offload_params", "quantised weights cannot be offloaded by ZeRO/FSDP; set offload_params: none."))
    if method.kind == "qlora" and mem.distributed == "deepspeed" and mem.zero_stage == 3 and method.quantization and method.quantization.bits == 8:
        problems.append(Problem(
            "method.quantization.bits", "8-bit weights cannot be sharded by ZeRO-3; use bits: 4 or zero_stage 2."))
    if mem.optimizer in ("adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit") and mem.distributed == "deepspeed":
        problems.append(Problem(
            "memory.optimizer", "DeepSpeed brings its own optimizer and ignores bitsandbytes ones: use adamw_torch."))
    if mem.optimizer == "adamw_torch_fused" and not recipe.uses_gpu:
        problems.append(Problem("memory.optimizer", "adamw_torch_fused needs a GPU; use adamw_torch on the CPU."))
    return problems


def _precision(recipe: Recipe) -> list[Problem]:
    mem, model = recipe.memory, recipe.model
    problems = []
    if mem.mixed_precision == "fp16" and model.dtype == "bfloat16":
        problems.append(Problem("model.dtype", "fp16 mixed precision with bfloat16 weights: set dtype: float16 or mixed_precision: bf16."))
    if mem.mixed_precision == "fp16" and not recipe.uses_gpu:
        problems.append(Problem("memory.mixed_precision", "fp16 mixed precision needs a GPU; use bf16 or no on the CPU."))
    if mem.mixed_precision in ("fp16", "bf16") and model.dtype == "float16" and recipe.method.kind == "full":
        problems.append(Problem(
            "model.dtype", "full fine-tuning of float16 weights is unstable: load float32 or bfloat16 weights."))
    if mem.mixed_precision == "bf16" and recipe.hardware.gpu is not None:
        try:
            spec = lookup_gpu(recipe.hardware.gpu)
        except KeyError:
            spec = None
        if spec is not None and not spec.bf16:
            problems.append(Problem(
                "memory.mixed_precision", f"{spec.name} has no bf16 support: use fp16 (with dtype float16 or float32)."))
    if mem.attention == "flash" and not recipe.uses_gpu:
        problems.append(Problem("memory.attention", "flash attention needs a CUDA GPU; use sdpa or auto on the CPU."))
    return problems


def _training(recipe: Recipe) -> list[Problem]:
    training, output, method = recipe.training, recipe.output, recipe.method
    problems = []
    if output.save in ("adapter", "merged") and method.kind == "full":
        problems.append(Problem("output.save", f"save: {output.save} needs an adapter; full fine-tuning saves full weights."))
    if training.eval_steps is not None and recipe.data.eval_fraction == 0:
        problems.append(Problem("training.eval_steps", "eval_steps without evaluation data: set data.eval_fraction above 0 or remove eval_steps."))
    return problems


def _lora_targets(recipe: Recipe) -> list[Problem]:
    """Named LoRA targets must name modules of the model, and PEFT must accept them (its facts, from the catalog or
    local files; no download): a fused expert pair named in part, or dropout on fused experts, PEFT refuses."""
    lora = recipe.method.lora
    if recipe.method.kind == "full":
        return []
    from tuner.catalog.models import UnknownModelError, model_facts

    try:
        facts = model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code)
    except UnknownModelError:
        return []  # the plan says the model is unknown; the loader checks the names against the real model
    problems = []
    targets = facts.peft_targets(lora.target_modules, lora.target_parameters)
    if targets.refusal:
        problems.append(Problem("method.lora.target_modules", f"{targets.refusal}: name both, or neither."))
    if lora.dropout > 0 and facts.adapts_parameters(lora.target_modules, lora.target_parameters):
        problems.append(Problem(
            "method.lora.dropout",
            f"PEFT adapts {recipe.model.id}'s fused experts as parameters, and refuses to wrap them: "
            "\"lora.ParamWrapper does not work with lora_dropout != 0.\" Set dropout: 0, or target only its linear "
            "layers (e.g. [q_proj, k_proj, v_proj, o_proj])."))
    if lora.target_modules == "all-linear":
        return problems
    names = list(dict.fromkeys(lin.name.split(".")[-1] for lin in facts.layer_linears() if lin.is_nn_linear))
    known = set(names) | {lin.name for kind in facts.layer_kinds for lin in kind.linears} | \
        set(facts.inventory.peft_moe_mapping) | {"lm_head", "embed_tokens"}
    unmatched = [name for name in lora.target_modules if name not in known and name.split(".")[-1] not in known]
    if not unmatched:
        return problems
    return problems + [Problem(
        "method.lora.target_modules",
        f"{', '.join(repr(name) for name in unmatched)} match{'es' if len(unmatched) == 1 else ''} no module of "
        f"{recipe.model.id}; its linear layers are {', '.join(names)} (and lm_head): pick from them, or use "
        "all-linear.")]


def _long_context(recipe: Recipe) -> list[Problem]:
    mem, lora = recipe.memory, recipe.method.lora
    problems = []
    if mem.activation_offloading and not mem.gradient_checkpointing:
        problems.append(Problem(
            "memory.activation_offloading",
            "activation offloading holds the checkpointed layer inputs in CPU RAM: set gradient_checkpointing: true "
            "too, or activation_offloading: false."))
    if mem.activation_offloading and not recipe.uses_gpu:
        problems.append(Problem(
            "memory.activation_offloading",
            "on the CPU the activations already live in CPU RAM (and transformers' offload pins host memory, which "
            "needs a GPU): set activation_offloading: false."))
    if mem.chunked_loss and (mem.distributed == "fsdp" or (mem.distributed == "deepspeed" and mem.zero_stage == 3)):
        problems.append(Problem(
            "memory.chunked_loss",
            "the chunked loss reads the output head's weight outside its forward, where ZeRO-3 and FSDP keep it "
            "sharded: use zero_stage 2 (or ddp), or set chunked_loss: false."))
    if mem.chunked_loss and mem.liger:
        problems.append(Problem(
            "memory.chunked_loss",
            "liger's fused linear cross-entropy already computes the loss in chunks (on GPU): set chunked_loss: false "
            "or liger: false."))
    adapted = ([] if lora.target_modules == "all-linear" else list(lora.target_modules)) + list(lora.modules_to_save)
    if mem.chunked_loss and recipe.method.kind != "full" and "lm_head" in adapted:
        problems.append(Problem(
            "memory.chunked_loss",
            "the chunked loss multiplies by the output head's own weight, so it cannot train lm_head through an adapter "
            "or modules_to_save: remove lm_head there, or set chunked_loss: false."))
    return problems


def _parallelism(recipe: Recipe) -> list[Problem]:
    """tp/cp/sp and the data-parallel degrees, as Accelerate, DeepSpeed and transformers accept them."""
    par, mem, hw = recipe.parallelism, recipe.memory, recipe.hardware
    if par.model_parallel == 1 and par.dp_replicate is None and par.dp_shard is None:
        return []
    problems = []
    world = recipe.world_size
    if par.tp > 1 and mem.distributed not in ("deepspeed", "fsdp"):
        problems.append(Problem(
            "parallelism.tp", "tensor parallelism runs under distributed: deepspeed (DeepSpeed AutoTP, ZeRO 0-2) or "
            "fsdp (transformers' tensor-parallel plan with FSDP2): set one of them, or tp: 1.",
            anchor="parallelism"))
    if par.cp > 1 and mem.distributed != "fsdp":
        problems.append(Problem(
            "parallelism.cp", "context parallelism is torch's ring attention under FSDP2: set distributed: fsdp, or "
            "use sp (DeepSpeed Ulysses) with deepspeed.", anchor="parallelism"))
    if par.sp > 1 and mem.distributed != "deepspeed":
        problems.append(Problem(
            "parallelism.sp", "sequence parallelism is DeepSpeed Ulysses: set distributed: deepspeed, or use cp "
            "(context parallelism) with fsdp.", anchor="parallelism"))
    if (par.cp > 1 or par.sp > 1) and not recipe.uses_gpu:
        field = "parallelism.cp" if par.cp > 1 else "parallelism.sp"
        problems.append(Problem(
            field, "splitting sequences needs GPUs (ring attention and Ulysses' all-to-all are not run on CPU ranks "
            "here): use tp on the CPU, or set hardware.gpus_per_machine.", anchor="parallelism"))
    if par.tp > 1 and recipe.method.kind != "full":
        problems.append(Problem(
            "parallelism.tp", f"tuner's tensor parallelism trains full weights; {recipe.method.kind} adapters are not "
            "split by DeepSpeed AutoTP or transformers' plan: set method.kind: full, or tp: 1.", anchor="parallelism"))
    if par.tp > 1 and mem.distributed == "deepspeed" and mem.zero_stage == 3:
        problems.append(Problem(
            "memory.zero_stage", "DeepSpeed AutoTP trains with ZeRO 0-2 (transformers cannot load a ZeRO-3 model with "
            "tensor_parallel): set zero_stage to 1 or 2, or distributed: fsdp for tp with full sharding."))
    if par.tp > 1 and mem.chunked_loss:
        problems.append(Problem(
            "memory.chunked_loss", "the chunked loss multiplies by the whole output head, which tensor parallelism "
            "splits by vocabulary: set chunked_loss: false, or tp: 1."))
    if hw.gpus_per_machine and par.tp > 1 and hw.gpus_per_machine % par.tp:
        problems.append(Problem(
            "parallelism.tp", f"tensor parallelism stays within a machine (it all-reduces inside every layer): tp "
            f"must divide gpus_per_machine ({hw.gpus_per_machine}).", anchor="parallelism"))
    if mem.distributed == "deepspeed":
        if par.dp_replicate is not None or par.dp_shard is not None:
            field = "parallelism.dp_replicate" if par.dp_replicate is not None else "parallelism.dp_shard"
            problems.append(Problem(
                field, "with deepspeed, ZeRO shards over all data-parallel ranks, num_processes / (tp x sp): remove "
                "dp_replicate and dp_shard (they lay out fsdp)."))
        elif world % (par.tp * par.sp):
            problems.append(Problem(
                "parallelism.tp" if par.tp > 1 else "parallelism.sp",
                f"tp x sp = {par.tp * par.sp} must divide the {world} processes, so that each data-parallel "
                "group is whole: change it, or hardware.num_processes.", anchor="parallelism"))
    elif mem.distributed == "fsdp" and (par.tp > 1 or par.cp > 1):
        total = par.dp_replicate * par.dp_shard * par.tp * par.cp
        if par.tp > 1 and par.cp > 1:
            problems.append(Problem(
                "parallelism.cp", "with fsdp, tp shards the model while transformers loads it (DistributedConfig), "
                "whose mesh has no cp dimension; cp runs under Accelerate's FSDP2 only without tp: use tp or cp, or "
                "sp (DeepSpeed Ulysses) with tp under deepspeed.", anchor="parallelism"))
        elif total != world:
            problems.append(Problem(
                "parallelism.dp_shard",
                f"dp_replicate x dp_shard x tp x cp = {par.dp_replicate} x {par.dp_shard} x {par.tp} x {par.cp} = "
                f"{total}, but the run has {world} processes: make the product equal num_processes (remove dp_shard "
                "to derive it).", anchor="parallelism"))
        elif par.dp_replicate > 1 and par.dp_shard == 1:
            problems.append(Problem(
                "parallelism.dp_shard", "Accelerate refuses tensor/context parallelism with pure replication "
                "(dp_replicate > 1, dp_shard 1): shard inside each copy (dp_shard > 1), or set dp_replicate: 1.",
                anchor="parallelism"))
        elif par.dp_shard == 1 and par.cp == 1:
            problems.append(Problem(
                "parallelism.tp", f"with fsdp and tp {par.tp} on {world} processes no rank is left for FSDP to shard "
                "across, which Accelerate refuses: use more processes (dp_shard 2 or more), or distributed: deepspeed "
                "with zero_stage 1 or 2 for tensor parallelism alone.", anchor="parallelism"))
    elif par.dp_replicate is not None or par.dp_shard is not None:
        field = "parallelism.dp_replicate" if par.dp_replicate is not None else "parallelism.dp_shard"
        problems.append(Problem(field, "dp_replicate and dp_shard lay out fsdp with tp or cp: remove them."))
    if par.cp > 1 and mem.attention != "sdpa":
        problems.append(Problem(
            "memory.attention", "context parallelism replaces PyTorch's SDPA with ring attention: set attention: sdpa.",
            anchor="parallelism.cp"))
    if par.sp > 1 and mem.attention == "eager":
        problems.append(Problem(
            "memory.attention", "DeepSpeed Ulysses wraps sdpa or flash attention, not eager: set attention: sdpa.",
            anchor="parallelism.sp"))
    for name, size, multiple in (("cp", par.cp, 2 * par.cp), ("sp", par.sp, par.sp)):
        if size > 1 and recipe.memory.max_seq_length % multiple:
            problems.append(Problem(
                "memory.max_seq_length", f"{name} {size} splits each sequence into {multiple} equal parts: make "
                f"max_seq_length a multiple of {multiple}.", anchor=f"parallelism.{name}"))
    return problems + _heads_divisible(recipe)


def tp_uneven(facts, tp: int) -> tuple[list[str], list[int]]:
    """What tensor parallelism over ``tp`` ranks cannot split evenly (e.g. ``["KV heads 8"]``: tp splits attention
    heads, KV heads and the MLP width), and the sizes from 2 up that split all three; ``facts`` are the planner's."""
    widths = (("attention heads", facts.num_heads), ("KV heads", facts.num_kv_heads),
              ("MLP width", facts.intermediate_size))
    uneven = [f"{name} {value}" for name, value in widths if value % tp]
    fitting = [size for size in range(2, facts.num_kv_heads + 1) if not any(value % size for _, value in widths)]
    return uneven, fitting


def _heads_divisible(recipe: Recipe) -> list[Problem]:
    """tp splits heads, KV heads and the MLP width; sp splits heads: each must divide evenly (the model's facts)."""
    par = recipe.parallelism
    if par.tp == 1 and par.sp == 1:
        return []
    from tuner.catalog.models import UnknownModelError, model_facts

    try:
        facts = model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code)
    except UnknownModelError:
        return []  # the plan says the model is unknown
    problems = []
    uneven, fitting = tp_uneven(facts, par.tp)
    if uneven:
        advice = f"use tp {' or '.join(map(str, fitting))}" if fitting else "this model cannot be split by tp"
        problems.append(Problem(
            "parallelism.tp", f"tp {par.tp} must divide {recipe.model.id}'s {', '.join(uneven)}: {advice}, or "
            "tp: 1.", anchor="parallelism"))
    if par.sp > 1 and (facts.num_heads % par.sp or (facts.num_kv_heads % par.sp and par.sp % facts.num_kv_heads)):
        problems.append(Problem(
            "parallelism.sp", f"Ulysses gives each rank num_heads / sp heads: sp {par.sp} must divide "
            f"{recipe.model.id}'s {facts.num_heads} attention heads, and divide or be a multiple of its "
            f"{facts.num_kv_heads} KV heads.", anchor="parallelism"))
    return problems


def _known_facts(recipe: Recipe):
    """The model's facts (catalog, local files, hub cache), or None when tuner has none or the model ships its own
    code (whose classes transformers' table does not describe)."""
    from tuner.catalog.models import UnknownModelError, model_facts

    if custom_code(recipe.model.id, recipe.model.revision):
        return None
    try:
        return model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code)
    except UnknownModelError:
        return None  # the plan says the model is unknown; the loader meets transformers' own checks


def _loads(recipe: Recipe) -> list[Problem]:
    """What transformers and PEFT refuse when this model loads or is wrapped, refused first, in their words: an
    attention implementation the model class does not support (transformers' ``_supports_sdpa`` /
    ``_supports_flash_attn``, from :mod:`tuner.catalog.model_classes`), and for qlora a ``modules_to_save`` layer
    bitsandbytes quantises (its copy cannot train).  LoRA dropout on fused experts, which PEFT refuses, is
    :func:`_lora_targets`' check."""
    facts = _known_facts(recipe)
    if facts is None:
        return []
    from tuner.catalog.model_classes import model_class

    problems = []
    attention, cls = recipe.memory.attention, model_class(facts.model_type)
    if cls is not None and not cls.supports(attention):
        fallback = "sdpa" if attention == "flash" and cls.sdpa else "eager"
        problems.append(Problem(
            "memory.attention", f"transformers {cls.transformers_version} refuses attention {attention} for "
            f"{cls.name} ({recipe.model.id}): \"{cls.refusals.get(attention, '')}\" Set attention: {fallback}, or "
            f"auto (flash-attention where flash-attn is installed and {cls.name} supports it, else "
            f"{'sdpa' if cls.sdpa else 'eager'})."))
    if recipe.memory.chunked_loss and facts.final_logit_softcapping:
        problems.append(Problem(
            "memory.chunked_loss", f"{recipe.model.id} soft-caps its logits (final_logit_softcapping "
            f"{facts.final_logit_softcapping:g}), which the chunked loss cannot do: set chunked_loss: false."))
    lora = recipe.method.lora
    if recipe.method.kind == "qlora" and lora.modules_to_save:
        # bitsandbytes quantises the decoder layers' nn.Linear maps (lm_head and embeddings stay in model.dtype)
        quantised = sorted({lin.name.split(".")[-1] for kind in facts.layer_kinds for lin in kind.linears
                            if lin.quantized and any(lin.name == name or lin.name.endswith("." + name)
                                                     or lin.name.split(".")[-1] == name
                                                     for name in lora.modules_to_save)})
        if quantised:
            bits = recipe.method.quantization.bits if recipe.method.quantization else 4
            problems.append(Problem(
                "method.lora.modules_to_save", f"bitsandbytes quantises {', '.join(quantised)} of {recipe.model.id} "
                f"to {bits}-bit, and PEFT's trained copy of a quantised layer cannot take gradients: \"only Tensors "
                "of floating point dtype can require gradients\" Adapt it with target_modules instead, keep "
                "modules_to_save to unquantised modules (lm_head, embed_tokens, norms), or set method.kind: lora."))
    return problems


def remote_code_problem(model_id: str, revision: str | None, trust_remote_code: bool) -> str | None:
    """Why a model cannot be loaded as the recipe stands: it ships code (config.json's auto_map) the recipe does not
    allow to run.  Read from a local folder or the Hugging Face cache, before anything runs it."""
    classes = custom_code(model_id, revision)
    if not classes or trust_remote_code:
        return None
    return (f"{model_id} ships its own Python code ({', '.join(classes)}), which runs on every rank when the model "
            "loads; set model.trust_remote_code: true if you trust its author (and pin model.revision to a commit "
            "you reviewed), or use a model without custom code.")


def _model(recipe: Recipe) -> list[Problem]:
    model = recipe.model
    problem = remote_code_problem(model.id, model.revision, model.trust_remote_code)
    problems = [Problem("model.trust_remote_code", problem, anchor="model.id")] if problem else []
    damaged = model_config_problem(model.id)
    return problems + ([Problem("model.id", damaged)] if damaged else [])


def model_config_problem(model_id: str) -> str | None:
    """What is wrong with a local model folder's config.json (not a mapping, impossible sizes, too deep), named
    with the file and the key; None when it is sound or model.id is not a local folder."""
    from pathlib import Path

    from tuner.catalog.model_config import ModelConfigError, read_config

    try:
        config_file = Path(model_id).expanduser() / "config.json"
        if not config_file.is_file():
            return None
    except (OSError, RuntimeError, ValueError):  # a name the filesystem cannot hold: not a folder
        return None
    try:
        read_config(config_file)
    except ModelConfigError as exc:
        return str(exc)
    return None


# the data layouts each objective reads (auto detects among them), from the schema
OBJECTIVE_FORMATS = {kind: data.formats for kind, data in OBJECTIVE_DATA.items()}


def _objective(recipe: Recipe) -> list[Problem]:
    objective, data = recipe.objective, recipe.data
    kind = objective.kind
    problems = []
    if data.format != "auto" and data.format not in OBJECTIVE_FORMATS[kind]:
        wanted = " or ".join(OBJECTIVE_FORMATS[kind])
        owner = next(name for name, formats in OBJECTIVE_FORMATS.items() if data.format in formats)
        problems.append(Problem(
            "data.format", f"objective {kind} reads {wanted} data, not {data.format}: set data.format to {wanted} "
                           f"(or auto), or set objective.kind: {owner}."))
    if not objective.preference:
        if objective.loss_type is not None and kind == "sft":
            problems.append(Problem(
                "objective.loss_type", "loss_type is a dpo/kto/grpo setting: remove it, or set objective.kind: dpo, "
                                       "kto or grpo."))
        return problems
    if objective.beta == 0:
        problems.append(Problem("objective.beta", f"{kind} measures how far the policy moved from the reference "
                                                  f"with beta: set it above 0 (e.g. 0.1)."))
    if objective.loss_type not in LOSS_TYPES[kind]:
        problems.append(Problem(
            "objective.loss_type",
            f"{objective.loss_type} is not a {kind} loss; use one of {', '.join(LOSS_TYPES[kind])}."))
    if objective.loss_type == "exo_pair" and objective.label_smoothing == 0:
        problems.append(Problem("objective.label_smoothing", "exo_pair needs label_smoothing above 0 (the EXO paper uses 1e-3).",
                                anchor="objective.loss_type"))
    if objective.sft_weight and kind != "dpo":
        problems.append(Problem("objective.sft_weight", "sft_weight adds the chosen answers' NLL to a dpo loss; "
                                                        "remove it, or set objective.kind: dpo."))
    if kind == "kto" and objective.loss_type == "kto" and recipe.memory.micro_batch_size < 2:
        problems.append(Problem(
            "memory.micro_batch_size",
            "KTO estimates its KL term from the other samples of a micro-batch: set micro_batch_size to 2 or more "
            "(or loss_type: apo_zero_unpaired, which has no KL term).", anchor="objective.kind"))
    if data.packing:
        problems.append(Problem(
            "data.packing", f"{kind} pads each micro-batch (TRL 1.16 turns padding_free off): set packing: false."))
    if data.train_on_prompt:
        problems.append(Problem(
            "data.train_on_prompt", f"{kind} compares the completions only: set train_on_prompt: false."))
    return problems


def _streaming(recipe: Recipe) -> list[Problem]:
    """A stream (data.streaming) has no length: nothing can be counted, split off or prepared whole up front."""
    data = recipe.data
    if not data.streaming:
        return []
    problems = []
    if recipe.training.max_steps is None:
        problems.append(Problem(
            "training.max_steps", "a stream has no length, so epochs cannot be counted: set max_steps (optimizer "
            "steps to train for), or data.streaming: false.", anchor="data.streaming"))
    if data.eval_fraction > 0:
        problems.append(Problem(
            "data.eval_fraction", "a stream has no length to hold a fraction of out: set eval_fraction: 0, or "
            "data.streaming: false to evaluate on held-out samples.", anchor="data.streaming"))
    if data.num_proc and data.num_proc > 1:
        problems.append(Problem(
            "data.num_proc", "a stream is tokenised by each rank as training reads it, not by a pool of processes "
            "up front: remove num_proc, or set data.streaming: false.", anchor="data.streaming"))
    if recipe.parallelism.model_parallel > 1:
        problems.append(Problem(
            "data.streaming", "a stream is read by each rank for its own batches (tested with data parallelism), but "
            "tensor-, context- and sequence-parallel ranks must share theirs: set streaming: false, or tp, cp and sp "
            "to 1."))
    if recipe.objective.preference:
        problems.append(Problem(
            "data.streaming", f"{recipe.objective.kind} trains on a dataset TRL's trainer tokenises whole before the "
            "first step, not on a stream: set streaming: false, or objective.kind: sft."))
    return problems


DPO_KTO_FIELDS = {"label_smoothing": 0.0, "sft_weight": 0.0, "precompute_ref_log_probs": False,
                  "desirable_weight": 1.0, "undesirable_weight": 1.0}  # and their defaults


def _grpo(recipe: Recipe) -> list[Problem]:
    """grpo's sizes (whole groups in every generation round, prompt + completion within the planned length), its
    rewards, its generation backend, and the settings of other objectives or tactics it cannot use."""
    from tuner.recipe.rewards import reward_problems

    objective, mem, data = recipe.objective, recipe.memory, recipe.data
    if objective.kind != "grpo":
        return [Problem("objective.grpo", "objective.grpo holds grpo settings: remove it, or set objective.kind: "
                                          "grpo.")] if objective.grpo is not None else []
    grpo, problems = objective.grpo, []
    for field, default in DPO_KTO_FIELDS.items():
        if getattr(objective, field) != default:
            problems.append(Problem(f"objective.{field}", f"{field} is a dpo/kto setting: remove it, or set "
                                                          "objective.kind: dpo or kto."))
    if objective.loss_type not in GRPO_LOSS_TYPES:
        problems.append(Problem("objective.loss_type", f"{objective.loss_type} is not a grpo loss; use one of "
                                                       f"{', '.join(GRPO_LOSS_TYPES)}."))
    prompt, completion = grpo.max_prompt_length, grpo.max_completion_length
    if prompt + completion > mem.max_seq_length:
        problems.append(Problem(
            "objective.grpo.max_completion_length", f"max_prompt_length + max_completion_length = {prompt} + "
            f"{completion} = {prompt + completion} tokens, more than memory.max_seq_length ({mem.max_seq_length}), "
            "which the memory plan is made for: lower one of them, or raise max_seq_length.",
            anchor="objective.grpo"))
    groups, ranks = grpo.num_generations, recipe.data_parallel
    round_size = mem.micro_batch_size * ranks * grpo.steps_per_generation
    if round_size % groups:
        problems.append(Problem(
            "objective.grpo.num_generations", f"a generation round samples micro_batch_size x data-parallel ranks x "
            f"steps_per_generation = {mem.micro_batch_size} x {ranks} x {grpo.steps_per_generation} = {round_size} "
            f"completions, which must be whole groups of num_generations ({groups}): make num_generations divide "
            f"{round_size}, or change micro_batch_size or steps_per_generation.", anchor="objective.grpo"))
    elif data.eval_fraction > 0 and (mem.micro_batch_size * ranks) % groups:
        problems.append(Problem(
            "memory.micro_batch_size", f"evaluation samples micro_batch_size x data-parallel ranks = "
            f"{mem.micro_batch_size * ranks} completions at a time, which must be whole groups of num_generations "
            f"({groups}): make it a multiple of {groups}, or set data.eval_fraction: 0.", anchor="objective.grpo"))
    if not grpo.rewards:
        problems.append(Problem("objective.grpo.rewards", "grpo scores completions with rewards: add at least one, "
                                                          "e.g. rewards: [{kind: exact_match, column: answer}].",
                                anchor="objective.grpo"))
    for index, reward in enumerate(grpo.rewards):
        for field, message in reward_problems(reward):
            problems.append(Problem(f"objective.grpo.rewards.{index}.{field}", message,
                                    anchor=f"objective.grpo.rewards.{index}"))
        if reward.kind == "model":
            problem = remote_code_problem(reward.model, None, recipe.model.trust_remote_code)
            if problem:
                problems.append(Problem(f"objective.grpo.rewards.{index}.model", problem))
    vllm = grpo.generation != "transformers"
    if vllm and not recipe.uses_gpu:
        problems.append(Problem("objective.grpo.generation", f"{grpo.generation} runs vLLM, which needs CUDA GPUs: "
                                                             "set hardware.gpus_per_machine, or generation: "
                                                             "transformers."))
    if grpo.vllm_sleep_mode and grpo.generation != "vllm_colocate":
        problems.append(Problem("objective.grpo.vllm_sleep_mode", "sleep mode frees the GPU memory of a vLLM engine "
                                                                  "inside the training process: set generation: "
                                                                  "vllm_colocate, or vllm_sleep_mode: false."))
    for field, why in (("packing", "pads its completions (TRL's GRPOTrainer packs nothing)"),
                       ("train_on_prompt", "learns from its completions only"),
                       ("streaming", "samples its prompts from a dataset TRL indexes (its RepeatSampler)")):
        if getattr(data, field):
            problems.append(Problem(f"data.{field}", f"grpo {why}: set {field}: false."))
    if recipe.parallelism.model_parallel > 1:
        problems.append(Problem("parallelism", "grpo is trained with data parallelism here: TRL 1.16's GRPOTrainer "
                                               "refuses cp and sp, and tp is not tested with it: set tp, cp and sp "
                                               "to 1."))
    if mem.chunked_loss:
        problems.append(Problem("memory.chunked_loss", "TRL's fused log-prob head already builds no full logits for "
                                                       "grpo: set chunked_loss: false."))
    return problems


RULES = (_model, _topology, _sharding, _parallelism, _method, _lora_targets, _loads, _precision, _training,
         _long_context, _objective, _grpo, _streaming)


def find_problems(recipe: Recipe) -> list[Problem]:
    """All cross-field conflicts of a type-valid recipe, in rule order."""
    return [problem for rule in RULES for problem in rule(recipe)]
