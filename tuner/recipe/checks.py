"""Cross-field rules of a recipe, grouped by topic.

Each rule names the one field a user should change and says how, so a
conflict is reported at that field's line rather than at the top of the file.
"""
from __future__ import annotations

from tuner.catalog.gpus import AmbiguousGpuError, known_gpu_names, lookup_gpu
from tuner.recipe.distill_checks import _distill
from tuner.recipe.expert_checks import expert_pipeline_problems
from tuner.recipe.model_checks import _loads, _model
from tuner.recipe.objective_checks import _grpo, _objective, _streaming
from tuner.recipe.problem import Problem
from tuner.recipe.schema import Recipe


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
    if mem.distributed == "fsdp" and not hw.gpus_per_machine and recipe.parallelism.ep == 1:
        # with ep transformers applies FSDP2 itself while loading (DistributedConfig), on gloo CPU ranks too
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
    if recipe.training.optimizer in ("adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit") and mem.distributed == "deepspeed":
        problems.append(Problem(
            "training.optimizer", "DeepSpeed brings its own optimizer and ignores bitsandbytes ones: use adamw_torch."))
    if recipe.training.optimizer == "adamw_torch_fused" and not recipe.uses_gpu:
        problems.append(Problem("training.optimizer", "adamw_torch_fused needs a GPU; use adamw_torch on the CPU."))
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
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

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
    parts = recipe.method.train
    if facts.inventory.parts and not targets.refusal and \
            facts.lora_params(lora.r, lora.target_modules, lora.target_parameters, parts=parts) == 0:
        problems.append(Problem(
            "method.train",
            f"LoRA finds no layer PEFT can adapt in the {' and '.join(parts)} of {recipe.model.id} (targets: "
            f"{lora.target_modules if isinstance(lora.target_modules, str) else ', '.join(lora.target_modules)}): "
            "add language_model to method.train, or train these parts in full (method.kind: full)."))
    if lora.target_modules == "all-linear":
        return problems
    names = list(dict.fromkeys(lin.name.split(".")[-1] for lin in facts.layer_linears() if lin.is_nn_linear))
    known = set(names) | {lin.name for kind in facts.layer_kinds for lin in kind.linears} | \
        set(facts.lora_inventory.peft_moe_mapping) | {"lm_head", "embed_tokens"}
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
    elif mem.distributed == "fsdp" and (par.tp > 1 or par.cp > 1 or par.ep > 1):
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
        elif par.dp_shard == 1 and par.cp == 1 and par.tp > 1:
            problems.append(Problem(
                "parallelism.tp", f"with fsdp and tp {par.tp} on {world} processes no rank is left for FSDP to shard "
                "across, which Accelerate refuses: use more processes (dp_shard 2 or more), or distributed: deepspeed "
                "with zero_stage 1 or 2 for tensor parallelism alone.", anchor="parallelism"))
    elif par.dp_replicate is not None or par.dp_shard is not None:
        field = "parallelism.dp_replicate" if par.dp_replicate is not None else "parallelism.dp_shard"
        problems.append(Problem(field, "dp_replicate and dp_shard lay out fsdp with tp, cp or ep: remove them."))
    if par.cp > 1 and mem.attention != "sdpa":
        problems.append(Problem(
            "memory.attention", "context parallelism replaces PyTorch's SDPA with ring attention: set attention: sdpa.",
            anchor="parallelism.cp"))
    if par.sp > 1 and mem.attention == "eager":
        problems.append(Problem(
            "memory.attention", "DeepSpeed Ulysses wraps sdpa or flash attention, not eager: set attention: sdpa.",
            anchor="parallelism.sp"))
    for name, size, multiple in (("cp", par.cp, 2 * par.cp), ("sp", par.sp, par.sp)):
        if size > 1 and recipe.training.max_seq_length % multiple:
            problems.append(Problem(
                "training.max_seq_length", f"{name} {size} splits each sequence into {multiple} equal parts: make "
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
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

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



RULES = (_model, _topology, _sharding, _parallelism, expert_pipeline_problems, _method, _lora_targets, _loads, _precision,
         _training, _long_context, _objective, _grpo, _distill, _streaming)


def find_problems(recipe: Recipe) -> list[Problem]:
    """All cross-field conflicts of a type-valid recipe, in rule order."""
    return [problem for rule in RULES for problem in rule(recipe)]
