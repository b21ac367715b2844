"""The analytic memory model: bytes per device for every phase of a run, term by term.

Pure arithmetic on a recipe and the model's architecture facts; no torch import, so a
plan answers in milliseconds.  Every item carries the key of its formula's source,
explained in ``docs/memory.md``.

Each item is live ``always`` (weights, optimizer states) or at some moments.  The training step has three:
``loss`` (end of the forward: saved activations plus the logits and loss buffers), ``layer backward``
(backward through one decoder layer, recomputed under gradient checkpointing) and ``optimizer step`` (the
full gradients and the optimizer's temporaries, when gradients are freed between steps).  The other phases of
a run have one moment each: ``evaluation`` (an eval batch, no gradients), ``saving``, ``resuming``,
``merging`` (an adapter into its base) and ``loading`` (weights materialised before training).  A device's
peak is ``always`` plus its largest moment, and its ``terms`` are what is live then, so they add up to its total.

Every item also says where torch would count it (``level``): ``allocated`` (live tensors,
``torch.cuda.max_memory_allocated``), ``reserved`` (what the caching allocator keeps beyond them, so
allocated + reserved items = ``torch.cuda.max_memory_reserved``) or ``device`` (outside the allocator: the CUDA
context, NCCL, the Python process; the sum of all three is what ``nvidia-smi`` shows).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

from tuner.catalog.facts import ModelFacts, ParamCounts
from tuner.catalog.models import model_facts
from tuner.planner.items import (GIB, TIGHT_HEADROOM, CANNOT_JUDGE, ALWAYS, FORWARD_BACKWARD, LAYER_BACKWARD, STEP,
                                 EVAL, SAVE, RESUME, MERGE, LOAD, TRAINING_STEP, GENERATION, BACKWARD, AFTER_LOADING,
                                 GPU_PHASES, CPU_PHASES, DTYPE_BYTES, NF4_DOUBLE_QUANT_BYTES, NF4_BYTES, ADAM8BIT_BYTES,
                                 CUDA_CONTEXT_GIB, NCCL_GIB, ALLOCATOR_ROUNDING, CPU_PROCESS_GIB,
                                 SAFETENSORS_SHARD_BYTES, ZERO3_MAX_LIVE_PARAMETERS, Item, DevicePlan, MemoryPlan)
from tuner.planner.layers import (all_layers_bytes, attention_span, backward_bytes, checkpointed_masks_bytes,
                                  forward_transient_bytes, kinds, largest,
                                  layer_bytes, lora_linears, mlp_width, residual_bytes)


@dataclass(frozen=True)
class _Setup:
    """The recipe reduced to what the memory model reads, for one rank."""

    facts: ModelFacts  # one tensor-parallel rank's share of a decoder layer (the model's own shape when tp is 1)
    model: ModelFacts  # the whole model (loading, saving and merging handle it whole)
    counts: ParamCounts  # the parameters one rank holds before ZeRO/FSDP sharding (the model's when tp is 1)
    kind: str  # full, lora, qlora
    weight_bytes: int  # model.dtype
    act_bytes: int  # activations: 16-bit under mixed precision, else the weights' dtype
    mixed: bool
    distributed: str
    zero: int | None
    fsdp: str
    world: int
    shard_group: int  # FSDP: the ranks a parameter is sharded across
    zero_ranks: int  # DeepSpeed: the ranks ZeRO partitions across (all but the tensor-parallel ones)
    offload_optimizer: str
    offload_params: str
    checkpointing: bool
    eager: bool
    flash: bool
    batch: int
    seq: int  # tokens of one sequence on one rank: max_seq_length over the cp x sp ranks that split it
    accumulation: int
    optimizer: str
    lora_r: int
    lora_targets: object
    lora_parameters: tuple[str, ...]
    lora_dropout: float
    quant_bits: int | None
    double_quant: bool
    on_gpu: bool
    gpus_per_machine: int
    liger: bool  # Liger's kernels are used: requested and on a GPU (the training entrypoint ignores them on the CPU)
    chunked_loss: bool
    activation_offloading: bool
    packing: bool
    evaluates: bool
    resumable: bool  # checkpoints are saved during training, or the run resumes: plan the resume
    save: str  # output.save
    fsdp_full_state_dict: bool
    fsdp_ram_efficient_loading: bool
    objective: str = "sft"  # sft, a preference objective (tuner.planner.preference) or grpo (tuner.planner.grpo)
    precompute: bool = False  # preference: reference log-probabilities computed before training
    reference: bool = False  # a reference model is compared with: dpo, kto, grpo with beta > 0
    rollout: object = None  # grpo: tuner.planner.grpo.Rollout
    tp: int = 1  # tensor-parallel ranks (parallelism.tp)
    seq_shards: int = 1  # ranks a sequence is split across: cp (ring attention) or sp (Ulysses)
    modules_to_save: tuple[str, ...] = ()  # method.lora.modules_to_save: trained in full beside the adapters
    logprob_fold: str | None = None  # dpo/kto: how TRL's fused head folds its tiles (tuner.planner.kernels)
    kernel_notes: tuple[str, ...] = ()  # the kernels the plan assumes, and why (tuner.planner.kernels)

    @property
    def held_weight_bytes(self) -> int:
        """Bytes of an unquantised parameter as the run holds it: a DeepSpeed bf16/fp16 engine casts every floating
        parameter, frozen ones too, to its 16-bit dtype (``_cast_module_mixed_precision``) `[zero]`; else
        model.dtype."""
        return 2 if self.distributed == "deepspeed" and self.zero is not None and self.mixed else self.weight_bytes

    @property
    def tp_label(self) -> str:
        """' (tp 1/8)' after an item one tensor-parallel rank holds a share of; '' without tensor parallelism."""
        return f" (tp 1/{self.tp})" if self.tp > 1 else ""


def rank_facts(model: ModelFacts, tp: int) -> ModelFacts:
    """One tensor-parallel rank's share of a decoder layer: transformers' plans and DeepSpeed AutoTP split q/k/v and
    gate/up by output columns and o/down by input rows, so a rank holds heads / tp, KV heads / tp and an MLP width
    / tp; the hidden width, the norms (and Qwen 3's q/k norms) and a MoE's router stay whole on every rank."""
    if tp == 1:
        return model
    return replace(model, tp=tp, num_heads=model.num_heads // tp, num_kv_heads=max(1, model.num_kv_heads // tp),
                   intermediate_size=model.intermediate_size // tp)


def rank_param_counts(model: ModelFacts, tp: int, distributed: str) -> ParamCounts:
    """The parameters one tensor-parallel rank holds: its share of every decoder layer (:func:`rank_facts`), and
    the output head and embeddings as the backend splits them.  DeepSpeed AutoTP (deepspeed) splits the output
    head by vocabulary and a tied embedding with it, and leaves an untied one whole (traced on two ranks:
    tests/test_rank_memory.py); transformers' plan (fsdp) splits an untied head by vocabulary and leaves the
    embeddings, and a head tied to them, whole."""
    counts = rank_facts(model, tp).param_counts
    if tp == 1:
        return counts
    if distributed == "deepspeed":
        embeddings = math.ceil(counts.embeddings / tp) if model.tie_word_embeddings else counts.embeddings
        return replace(counts, embeddings=embeddings, lm_head=math.ceil(counts.lm_head / tp))
    return replace(counts, lm_head=math.ceil(counts.lm_head / tp))


def _setup(recipe) -> _Setup:
    mem, method = recipe.memory, recipe.method
    quant = method.quantization
    weight_bytes = DTYPE_BYTES[recipe.model.dtype]
    mixed = mem.mixed_precision != "no"
    world = recipe.world_size
    objective = recipe.objective
    par = recipe.parallelism
    model = model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code)
    if mem.distributed == "fsdp" and par.model_parallel > 1:  # Accelerate's dp_shard_cp mesh: cp ranks shard too
        shard_group = par.dp_shard * par.cp
    elif mem.fsdp.sharding_strategy == "hybrid_shard":
        shard_group = min(world, recipe.hardware.gpus_per_machine)
    else:
        shard_group = world
    from tuner.planner.grpo import rollout_of
    from tuner.planner.kernels import kernels
    from tuner.planner.preference import sequences_per_sample

    chosen = kernels(recipe, model.model_type)
    return _Setup(
        facts=rank_facts(model, par.tp), model=model, counts=rank_param_counts(model, par.tp, mem.distributed),
        tp=par.tp, seq_shards=par.cp * par.sp,
        # ZeRO partitions across DeepSpeed's sequence-data-parallel group: every rank but the tensor-parallel ones
        zero_ranks=max(1, world // par.tp),
        kind=method.kind, weight_bytes=weight_bytes, act_bytes=2 if mixed else weight_bytes, mixed=mixed,
        distributed=mem.distributed, zero=mem.zero_stage, fsdp=mem.fsdp.sharding_strategy, world=world,
        shard_group=shard_group,
        offload_optimizer=mem.offload_optimizer, offload_params=mem.offload_params,
        checkpointing=mem.gradient_checkpointing, eager=chosen.attention == "eager", flash=chosen.attention == "flash",
        batch=mem.micro_batch_size * sequences_per_sample(objective.kind),
        # grpo's sequences are a prompt and a completion, each at most its length
        seq=(objective.grpo.max_prompt_length + objective.grpo.max_completion_length if objective.grpo else
             mem.max_seq_length) // (par.cp * par.sp),
        accumulation=mem.gradient_accumulation_steps, optimizer=mem.optimizer, lora_r=method.lora.r,
        lora_targets=method.lora.target_modules, lora_parameters=tuple(method.lora.target_parameters),
        lora_dropout=0.0 if objective.kind != "sft" else method.lora.dropout,  # TRL turns dropout off
        quant_bits=quant.bits if quant and method.kind == "qlora" else None,
        double_quant=bool(quant and quant.double_quant), on_gpu=recipe.uses_gpu,
        gpus_per_machine=recipe.hardware.gpus_per_machine, liger=chosen.liger,
        chunked_loss=mem.chunked_loss, activation_offloading=mem.activation_offloading and mem.gradient_checkpointing,
        packing=recipe.data.packing, evaluates=recipe.data.eval_fraction > 0, save=recipe.output.save,
        resumable=recipe.training.save_steps is not None or recipe.training.resume != "never",
        fsdp_full_state_dict=mem.fsdp.state_dict_type == "full",
        fsdp_ram_efficient_loading=mem.fsdp.cpu_ram_efficient_loading, objective=objective.kind,
        precompute=objective.precompute_ref_log_probs, reference=objective.reference_model,
        rollout=rollout_of(recipe) if objective.grpo else None, logprob_fold=chosen.logprob_fold,
        kernel_notes=chosen.notes, modules_to_save=tuple(method.lora.modules_to_save) if method.kind != "full" else (),
    )


# ---------------------------------------------------------------- model states

def _largest_module_params(facts: ModelFacts) -> int:
    """Parameters of the largest single module (what ZeRO-3 gathers at once: every expert of a MoE layer, whose
    experts transformers fuses into one tensor), as DeepSpeed's estimator counts."""
    return facts.largest_module_params()


def _layer_params(facts: ModelFacts) -> float:
    """Parameters of the largest decoder layer (FSDP's unit), one tensor-parallel rank's share of it."""
    whole = facts.largest_layer_params()
    if facts.tp == 1:
        return whole
    rank, model = facts.param_counts, replace(facts, tp=1).param_counts
    return whole * (rank.attention + rank.mlp + rank.norms) / max(model.attention + model.mlp + model.norms, 1)


def _trainable_lora(s: _Setup, facts: ModelFacts | None = None) -> int:
    """LoRA parameters PEFT adds for the recipe's targets (one rank's share of them under tensor parallelism)."""
    return (facts or s.facts).lora_params(s.lora_r, s.lora_targets, s.lora_parameters)


def _frozen_weight_items(s: _Setup) -> list[Item]:
    """Base weights of LoRA/QLoRA (frozen), before any sharding."""
    f, counts = s.facts, s.counts
    if s.quant_bits is None:
        return [Item("base weights (frozen)", "weights", counts.total * s.weight_bytes, source="dtype")]
    quantized = f.quantizable_params()
    rows = f.quantized_rows()
    if s.quant_bits == 4:
        per = NF4_DOUBLE_QUANT_BYTES if s.double_quant else NF4_BYTES
        q_item = Item(f"4-bit base weights ({per * 8:.3f} bits/param)", "weights", quantized * per, source="qlora")
    else:
        q_item = Item("8-bit base weights (+ fp32 row scales)", "weights", quantized + 4 * rows, source="llm-int8")
    rest = counts.total - quantized
    items = [q_item, Item("unquantised embeddings, norms, lm_head, biases (fp32 after k-bit preparation)",
                          "weights", rest * 4, source="peft-kbit")]
    if s.mixed:
        items.append(Item("autocast 16-bit copy of the fp32 output head", "weights",
                          f.vocab_size * f.hidden_size * 2, BACKWARD, source="autocast"))
    return items


def _frozen_autocast_copies(s: _Setup) -> list[Item]:
    """fp32 frozen weights under autocast: each linear casts its weight to 16 bits on every use (autocast caches
    casts only of tensors that require grad) and keeps the copy for the backward of its input, until that backward
    (under checkpointing only the recomputed layer's, plus the output head's)."""
    f, counts = s.facts, s.counts
    layers = counts.attention + counts.mlp
    head = Item("autocast 16-bit copy of the frozen fp32 output head", "weights",
                (counts.lm_head or counts.embeddings) * 2, BACKWARD, source="autocast")
    if s.checkpointing:
        return [head, Item("autocast 16-bit copies of one recomputed layer's frozen weights", "weights",
                           layers / f.num_layers * 2, LAYER_BACKWARD, source="autocast")]
    return [head, Item("autocast 16-bit copies of the frozen fp32 linear weights", "weights", layers * 2, BACKWARD,
                       source="autocast")]


def _model_state_items(s: _Setup) -> tuple[list[Item], list[Item], list[str]]:
    """(GPU items, host items per GPU, notes) for weights, adapters, gradients and optimizer states."""
    f, counts = s.facts, s.counts
    notes: list[str] = []
    full = s.kind == "full"
    trainable = counts.total if full else _trainable_lora(s, f)
    deepspeed = s.distributed == "deepspeed" and s.world >= 1 and s.zero is not None
    fsdp = s.distributed == "fsdp"
    n = s.zero_ranks if deepspeed else s.shard_group if fsdp else s.world
    gpu: list[Item] = []
    host: list[Item] = []

    def place(item: Item, offload: str) -> None:
        (host if offload != "none" else gpu).append(item)

    # -------- weights
    if full:
        frozen_items = []
    else:
        frozen_items = _frozen_weight_items(s)
    if deepspeed:
        w16 = 2 if s.mixed else 4  # DeepSpeed casts the module to its bf16/fp16 dtype
        if full:
            base = Item(("16-bit parameters" if s.mixed else "fp32 parameters") + s.tp_label, "weights",
                        counts.total * w16, source="zero")
            frozen_items = [base]
        elif s.mixed and s.quant_bits is None:
            # the engine casts every floating parameter, frozen ones too (_cast_module_mixed_precision): LoRA's
            # base is 16-bit under a bf16/fp16 engine whatever model.dtype (traced on gloo ranks: the MoE demo)
            frozen_items = [Item("base weights (frozen, cast to 16 bits by DeepSpeed)", "weights",
                                 counts.total * s.held_weight_bytes, source="zero")]
        if s.zero == 3:
            for item in frozen_items:
                place(Item(item.name + f" (ZeRO-3 shard 1/{n})", item.category, item.bytes / n, item.phase, item.source),
                      s.offload_params)
            # DeepSpeed releases a gathered parameter only when more than stage3_max_live_parameters (1e9) are live
            # or its reuse lies beyond stage3_max_reuse_distance (1e9): up to 1e9 parameters stay gathered through the
            # backward (all of a smaller model, as traced on gloo ranks), at least the estimator's two largest modules
            live = max(2 * _largest_module_params(f), min(counts.total, ZERO3_MAX_LIVE_PARAMETERS))
            gpu.append(Item("ZeRO-3 gathered live parameters (up to stage3_max_live_parameters)", "weights",
                            live * w16, BACKWARD, source="ds-live"))
            gpu.append(Item("ZeRO-3 prefetch and reduce buckets (0.9h^2 + h^2 elements)", "gradients",
                            1.9 * f.hidden_size**2 * w16, BACKWARD, source="hf-deepspeed"))
        else:
            gpu.extend(frozen_items)
    elif fsdp:
        sharded = s.fsdp in ("full_shard", "hybrid_shard", "shard_grad_op")
        group = s.shard_group if sharded else 1
        master = 4 if s.mixed or s.weight_bytes == 4 else s.weight_bytes  # Accelerate upcasts FSDP params to fp32 under mixed precision
        if full:
            frozen_items = [Item(("fp32 parameters (FSDP shard)" if master == 4 else "parameters (FSDP shard)")
                                 + s.tp_label, "weights", counts.total * master, source="fsdp")]
        for item in frozen_items:
            place(Item(item.name + (f" (shard 1/{group})" if group > 1 else ""), item.category, item.bytes / group,
                       item.phase, item.source), s.offload_params)
        compute = 2 if s.mixed else master
        if s.fsdp == "shard_grad_op":
            gpu.append(Item("unsharded 16-bit parameters kept through forward/backward", "weights",
                            counts.total * compute, BACKWARD, source="fsdp"))
        elif group > 1:
            root = counts.embeddings + counts.lm_head + f.hidden_size
            gpu.append(Item("gathered parameters (root module + two decoder layers)" + s.tp_label, "weights",
                            (root + 2 * _layer_params(f)) * compute, BACKWARD, source="fsdp"))
    else:
        if full:
            gpu.append(Item("parameters", "weights", counts.total * s.weight_bytes, source="dtype"))
            if s.mixed and s.weight_bytes == 4:
                linear = counts.attention + counts.mlp + (counts.lm_head or counts.embeddings)
                gpu.append(Item("autocast 16-bit copies of fp32 linear weights", "weights", linear * 2,
                                BACKWARD, source="autocast"))
        else:
            gpu.extend(frozen_items)
            if s.mixed and s.weight_bytes == 4 and s.quant_bits is None:
                gpu.extend(_frozen_autocast_copies(s))

    # -------- trainable parameters' gradients and optimizer states
    if full:
        param_bytes = (2 if s.mixed else 4) if deepspeed else (4 if fsdp and (s.mixed or s.weight_bytes == 4) else s.weight_bytes)
    else:
        param_bytes = (2 if s.mixed else 4) if deepspeed else 4  # PEFT keeps adapters in fp32
        shard = n if (deepspeed and s.zero == 3) or (fsdp and s.fsdp != "no_shard") else 1
        place(Item("LoRA adapter weights" + (f" (shard 1/{shard})" if shard > 1 else ""), "lora_adapter",
                   trainable * param_bytes / shard, source="peft"), s.offload_params)

    grad_persistent = s.accumulation > 1
    if deepspeed:
        # Per rank, as traced on gloo ranks (tests/test_rank_memory.py): stage 1/2 reduce the 16-bit gradients during
        # backward (stage 1 keeps them whole until the reduce, stage 2 keeps its partition) and free them once the step
        # has its fp32 copy; stage 3 keeps a persistent 16-bit partition buffer.  Every stage keeps an fp32 master
        # partition, also when the parameters are fp32.
        label = "16-bit" if s.mixed else "fp32"
        opt_shard = n if s.zero >= 1 else 1
        between_steps = ALWAYS if grad_persistent else BACKWARD
        if s.offload_optimizer != "none" and s.zero >= 2:
            # ZeRO-Offload reduces gradients through small GPU buckets straight into fp32 host buffers
            gpu.append(Item("gradient reduce buckets (h^2 elements)", "gradients", f.hidden_size**2 * param_bytes * 2,
                            source="hf-deepspeed"))
        elif s.zero >= 3:
            gpu.append(Item(f"{label} gradient partition (1/{n}){s.tp_label}", "gradients", trainable * param_bytes / n,
                            source="zero"))
        elif s.zero == 2:
            gpu.append(Item(f"{label} gradient partition (1/{n}){s.tp_label}", "gradients", trainable * param_bytes / n,
                            between_steps, source="zero"))
        else:
            gpu.append(Item(f"{label} gradients{s.tp_label}", "gradients", trainable * param_bytes, between_steps,
                            source="zero"))
            if s.zero == 1:
                gpu.append(Item(f"{label} partition of the reduced gradients (1/{n}) buffer", "gradients",
                                trainable * param_bytes / n, LAYER_BACKWARD, source="zero"))
        opt_label = (f" (ZeRO 1/{opt_shard})" if s.tp > 1 and opt_shard > 1 else "") + s.tp_label
        opt_items = [Item("Adam moments (fp32)" + opt_label, "optimizer", trainable * 8 / opt_shard, source="zero"),
                     Item("fp32 master weights" + opt_label, "optimizer", trainable * 4 / opt_shard, source="zero")]
        # stage 1/2 upcast the whole gradient partition for the step; stage 3 one sub-group (1e9 elements) at a time
        step_elements = trainable / opt_shard if s.zero < 3 else min(trainable / opt_shard, 1e9)
        opt_items.append(Item("fp32 gradients for the step", "gradients", step_elements * 4,
                              ALWAYS if s.offload_optimizer != "none" else STEP, source="ds-estimator"))
        for item in opt_items:
            place(item, s.offload_optimizer)
        if s.offload_optimizer == "none" and s.optimizer == "adamw_torch":
            # the Trainer's torch AdamW steps the flat fp32 partitions: foreach on CUDA makes one partition-sized
            # temporary, the CPU's single-tensor loop two
            gpu.append(Item("AdamW step temporaries (flat fp32 partition)", "optimizer",
                            trainable * 4 / opt_shard * (1 if s.on_gpu else 2), STEP, source="torch-adamw"))
    elif fsdp:
        shard = s.shard_group if s.fsdp != "no_shard" else 1
        # each layer's gradients are reduce-scattered into their shard as its backward ends: the shards fill up
        # through the backward (traced on gloo ranks), beside the unsharded gradients of the module being reduced
        place(Item(("fp32 gradients (sharded)" if shard > 1 else "gradients") + s.tp_label, "gradients",
                   trainable * param_bytes / shard, ALWAYS if grad_persistent else (LAYER_BACKWARD, STEP),
                   source="fsdp"), s.offload_optimizer)
        if shard > 1 and s.offload_optimizer == "none":
            # the root's gradients (output head first, embeddings last) wait for the root's reduce-scatter after
            # every layer's; a layer's wait only for its own backward to end.  Computed in the compute dtype.
            if full:
                head = counts.lm_head or counts.embeddings
                module = head + max(_layer_params(f), counts.embeddings if counts.lm_head else 0)
            else:
                module = trainable / f.num_layers
            gpu.append(Item("unsharded gradients awaiting reduce-scatter (output head, and a layer's)", "gradients",
                            module * (2 if s.mixed else param_bytes), LAYER_BACKWARD, source="fsdp"))
        place(Item("Adam moments" + (f" (shard 1/{shard})" if s.tp > 1 and shard > 1 else "") + s.tp_label,
                   "optimizer", trainable * 2 * param_bytes / shard, source="torch-adamw"),
              s.offload_optimizer)
        if s.optimizer == "adamw_torch" and s.offload_optimizer == "none":
            gpu.append(Item("foreach AdamW temporaries", "optimizer", trainable * param_bytes / shard, STEP,
                            source="torch-adamw"))
    else:
        grad_phase = ALWAYS if grad_persistent else STEP
        gpu.append(Item("gradients", "gradients", trainable * param_bytes, grad_phase, source="torch-autograd"))
        if s.distributed == "ddp" and n > 1:
            gpu.append(Item("DDP gradient buckets", "gradients", trainable * param_bytes, source="ddp"))
        state_bytes = {"adamw_8bit": ADAM8BIT_BYTES, "paged_adamw_8bit": ADAM8BIT_BYTES,
                       "paged_adamw_32bit": 8}.get(s.optimizer, 2 * param_bytes)
        label = "8-bit Adam moments" if "8bit" in s.optimizer else "Adam moments"
        gpu.append(Item(label, "optimizer", trainable * state_bytes, source="bnb" if "paged" in s.optimizer or "8bit" in s.optimizer else "torch-adamw"))
        if s.optimizer.startswith("paged"):
            notes.append("paged optimizer states can spill to host RAM under pressure; counted on the GPU here.")
        if s.optimizer == "adamw_torch":
            if s.on_gpu:  # torch picks the foreach implementation on CUDA: one state-sized temporary
                temp = trainable * param_bytes
            else:  # single-tensor loop on the CPU: sqrt and division temporaries of the largest tensor
                largest = max(_largest_module_params(f), f.vocab_size * f.hidden_size) if full else \
                    max(s.lora_r * (lin.in_features + lin.out_features) for lin in f.layer_linears())
                temp = 2 * min(largest, trainable) * param_bytes
            gpu.append(Item("AdamW step temporaries", "optimizer", temp, STEP, source="torch-adamw"))
    return gpu, host, notes


def _module_params(s: _Setup, name: str) -> tuple[int, int] | None:
    """(parameters, largest tensor) of the modules PEFT matches by ``name`` (``key.endswith(name)``, as
    ``_set_trainable`` does); None for a name tuner cannot size."""
    f, counts = s.facts, s.counts
    head = f.vocab_size * f.hidden_size
    if name == "lm_head":
        return head, head  # a tied head gets its own copy, untied from the embeddings
    if name in ("embed_tokens", "model.embed_tokens"):
        return counts.embeddings, counts.embeddings
    if name in ("norm", "layernorm") and f.inventory is not None:
        # every norm module whose path ends so, Qwen 3's q/k norms inside the attention too (counted there)
        norms = [group for group in f.inventory.groups if group.kind == "norm" and group.pattern.endswith(name)]
        return sum(group.numel for group in norms), max((group.own_numel for group in norms), default=0)
    if name in ("norm", "layernorm"):  # every norm's name ends so: the final one and each layer's
        return counts.norms, f.hidden_size
    if name == "model.norm":
        return f.hidden_size, f.hidden_size
    found = [(kind.count, lin) for kind in f.layer_kinds for lin in kind.linears
             if lin.name == name or lin.name.endswith("." + name)]
    if found:
        return (sum(count * (lin.weight_params + (lin.out_features * lin.count if lin.bias else 0))
                    for count, lin in found), max(lin.weight_params for _, lin in found))
    return None


def _trained_outside_layers_items(s: _Setup) -> tuple[list[Item], list[str]]:
    """What a LoRA recipe trains beyond the decoder layers' adapters: ``modules_to_save`` (PEFT keeps the frozen
    original and a trained copy in the model's dtype, with its gradient and AdamW moments) and LoRA adapters on the
    output head or the embeddings (fp32, like every adapter).  Gradients live from their backward to the step: the
    head's from the start of the backward, the others' at the step."""
    if s.kind == "full":
        return [], []
    f, w = s.facts, s.weight_bytes
    items, notes, largest = [], [], 0
    grad = ALWAYS if s.accumulation > 1 else STEP
    for name in s.modules_to_save:
        sized = _module_params(s, name)
        if sized is None:
            notes.append(f"method.lora.modules_to_save: {name!r} is not sized by the planner; its trained copy, "
                         "gradient and AdamW moments are not counted.")
            continue
        params, biggest = sized
        largest = max(largest, biggest)
        if name in ("norm", "layernorm"):  # a norm whose weight trains keeps its normalised input for that gradient
            widths = (max(sum(kind.norms) for kind in f.layer_kinds) if s.checkpointing else
                      sum(kind.count * sum(kind.norms) for kind in f.layer_kinds)) + f.hidden_size  # + the final norm
            items.append(Item("normalised inputs kept for the trained norms' gradients", "activations",
                              widths * s.batch * s.seq * s.act_bytes, BACKWARD, source="peft-save"))
        phase = ALWAYS if s.accumulation > 1 else (LAYER_BACKWARD, STEP) if name == "lm_head" else grad
        items += [Item(f"modules_to_save {name}: trained copy", "weights", params * w, source="peft-save"),
                  Item(f"modules_to_save {name}: gradient", "gradients", params * w, phase, source="peft-save"),
                  Item(f"modules_to_save {name}: AdamW moments", "optimizer", 2 * params * w, source="peft-save")]
    targets = [] if s.lora_targets == "all-linear" else list(s.lora_targets)
    outside = {"lm_head": (f.hidden_size, f.vocab_size), "embed_tokens": (f.vocab_size, f.hidden_size)}
    for name in [t for t in targets if t in outside]:
        params = s.lora_r * sum(outside[name])
        largest = max(largest, s.lora_r * max(outside[name]))
        phase = ALWAYS if s.accumulation > 1 else (LAYER_BACKWARD, STEP) if name == "lm_head" else grad
        items += [Item(f"LoRA adapter on {name}", "lora_adapter", params * 4, source="peft"),
                  Item(f"LoRA adapter on {name}: gradient", "gradients", params * 4, phase, source="peft"),
                  Item(f"LoRA adapter on {name}: AdamW moments", "optimizer", params * 8, source="peft")]
    if items and s.optimizer == "adamw_torch":  # CUDA's foreach: one state-sized temporary; the CPU: two of the largest
        temp = sum(i.bytes for i in items if i.category == "gradients") if s.on_gpu else 2 * largest * w
        items.append(Item("AdamW step temporaries of the modules trained beside the adapters", "optimizer", temp, STEP,
                          source="torch-adamw"))
    if items and s.distributed in ("deepspeed", "fsdp"):
        notes.append("modules_to_save and adapters on lm_head/embed_tokens are counted unsharded, as on one process "
                     "(ZeRO/FSDP shard them: an over-estimate).")
    return items, notes


# ---------------------------------------------------------------- activations

def softcapped_logits_items(s: _Setup, tokens: int) -> list[Item]:
    """Gemma-2 caps its logits, softcap x tanh(logits / softcap), before the loss: tanh keeps its T x V output (the
    logits' dtype) for backward, beside the loss buffers."""
    if not s.facts.final_logit_softcapping:
        return []
    return [Item("logit soft-capping: tanh's output kept for backward (s x b x V)", "logits_loss",
                 tokens * s.facts.vocab_size * s.act_bytes, FORWARD_BACKWARD, source="softcap")]


def _next_power_of_two(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _loss_items(s: _Setup, tokens: int, full: bool) -> list[Item]:
    """The output head and the cross-entropy at the end of the forward (and their gradients)."""
    f = s.facts
    h, vocab = f.hidden_size, f.vocab_size
    rb = residual_bytes(s)
    rotary = s.seq * f.head_dim * 2 * s.act_bytes
    final_norm = tokens * h * (4 + (s.act_bytes if full else 0))
    if s.objective != "sft":  # TRL's fused log-prob head replaces the logits and the cross-entropy
        from tuner.planner.grpo import loss_items as grpo_loss_items
        from tuner.planner.preference import loss_items

        loss_items = grpo_loss_items if s.rollout else loss_items

        return [Item("final norm, output-head input, rotary tables", "activations",
                     final_norm + tokens * h * s.act_bytes + rotary, FORWARD_BACKWARD, source="korthikanti"),
                *loss_items(s)]
    if s.liger:
        # LigerFusedLinearCrossEntropyFunction: logits of chunk_size rows, chunk_size = next_pow2(ceil(BT /
        # ceil(V / H))) so a chunk is ~BT x H elements; grad_input (BT x H) and, when the head trains, grad_weight
        # are computed in the forward; a fp32 loss per token.  The head's input is not kept.
        rows = min(tokens, _next_power_of_two(tokens / math.ceil(vocab / h)))
        return [
            Item("final norm (Liger: input and fp32 rstd), rotary tables", "activations",
                 tokens * (rb * h + 4) + rotary, FORWARD_BACKWARD, source="liger"),
            Item(f"Liger fused linear cross-entropy: {rows} x V logits chunk, head-input gradient, loss",
                 "logits_loss", rows * vocab * s.act_bytes + tokens * (h * rb + 4), FORWARD_BACKWARD, source="liger"),
        ]
    if s.chunked_loss:
        # torch.nn.functional.linear_cross_entropy with LinearCrossEntropyOptions(): chunks of rows tokens, rows =
        # next_pow2(ceil(N / ceil(V / H))) ("aspect_ratio"), halved on CUDA and for fp32 ("aspect_ratio:2");
        # the logits buffer is fp32 (acc_dtype) for 16-bit inputs; the gradient of the head's input (N x H) is made
        # in the forward, in the input dtype ("compact") or fp32 ("accurate": 16-bit inputs on the CPU)
        accurate = not s.on_gpu and rb == 2
        rows = min(tokens, max(1, _next_power_of_two(tokens / math.ceil(vocab / h)) // (1 if accurate else 2)))
        chunk = rows * vocab * 4 + tokens * h * (4 if accurate else rb) + tokens * 4
        if accurate:
            chunk += vocab * h * 4 + tokens * h * 4  # fp32 copies of the head's weight and input (no bf16 GEMM on CPU)
        return [
            Item("final norm, rotary tables", "activations", final_norm + rotary, FORWARD_BACKWARD,
                 source="korthikanti"),
            Item(f"chunked loss: {rows} x V logits buffer, head-input gradient", "logits_loss", chunk,
                 FORWARD_BACKWARD, source="torch-lce"),
        ]
    # final norm (fp32 upcast; normalised input when it trains), output-head input, rotary cos/sin
    return [
        Item("final norm, output-head input, rotary tables", "activations", final_norm + tokens * h * s.act_bytes + rotary,
             FORWARD_BACKWARD, source="korthikanti"),
        # logits: the 16-bit/fp32 logits, log_softmax output (fp32) and two fp32 gradients of it in backward
        Item("logits and cross-entropy (s x b x V)", "logits_loss", tokens * vocab * 12, FORWARD_BACKWARD,
             source="hf-loss"),
    ] + softcapped_logits_items(s, tokens)


def _activation_items(s: _Setup) -> tuple[list[Item], list[Item], list[str]]:
    """(device items, host items per process, notes) for activations and the loss; per layer kind
    (tuner.planner.layers), summed over the layers or, for the one layer recomputed or in backward, the largest."""
    f = s.facts
    tokens = s.batch * s.seq
    notes = []
    full = s.kind == "full"
    span = attention_span(s)
    if s.checkpointing:  # one layer is recomputed and then runs its backward: the worst layer kind for both at once
        worst = max(kinds(s), key=lambda kind: layer_bytes(s, kind, tokens) + backward_bytes(s, kind, tokens))
        recomputed, layer_backward = layer_bytes(s, worst, tokens), backward_bytes(s, worst, tokens)
    else:
        layer_backward = largest(backward_bytes, s, tokens)
    items, host = [], []
    sequence, split = _sequence_label(s), _activation_label(s)
    if s.checkpointing:
        inputs = Item(f"checkpointed layer inputs ({f.num_layers} layers{sequence})", "activations",
                      f.num_layers * tokens * f.hidden_size * residual_bytes(s), BACKWARD, source="korthikanti")
        if s.activation_offloading:  # transformers' offload: save_on_cpu around each checkpointed layer
            host.append(Item(inputs.name + ", offloaded to pinned host RAM", "activations", inputs.bytes, BACKWARD,
                             source="hf-offload"))
            items.append(Item("one checkpointed input copied back for its recompute", "activations",
                              tokens * f.hidden_size * residual_bytes(s), LAYER_BACKWARD, source="hf-offload"))
        else:
            items.append(inputs)
        items.append(Item(f"one layer recomputed in backward{split and f' ({split})'}", "activations",
                          recomputed, LAYER_BACKWARD, source=_layer_source(s)))
        masks = checkpointed_masks_bytes(s)
        if masks:
            items.append(Item("attention masks kept for the recompute", "activations", masks, BACKWARD,
                              source="layer-kinds"))
    else:
        items.append(Item(f"saved activations ({f.num_layers} layers{split and f'; {split}'})", "activations",
                          all_layers_bytes(s, tokens), BACKWARD, source=_layer_source(s)))
    items.append(Item("gradients of one layer's intermediates", "activations", layer_backward, LAYER_BACKWARD,
                      source="torch-autograd"))
    if full and s.accumulation == 1 and s.distributed in ("none", "ddp"):
        # backward reaches the layers after the output head's gradient exists (sharded engines keep grad buffers);
        # the fused losses compute it in the forward
        fused = s.liger or s.chunked_loss
        items.append(Item("gradient of the output head", "gradients", f.vocab_size * f.hidden_size * s.weight_bytes,
                          BACKWARD if fused else LAYER_BACKWARD, source="liger" if s.liger else
                          "torch-lce" if s.chunked_loss else "torch-autograd"))
        kept = tokens * f.hidden_size * residual_bytes(s) if s.checkpointing else min(
            layer_bytes(s, kind, tokens) for kind in s.model.layer_kinds)
        items += _finished_layer_gradients(s, kept)
    items += _loss_items(s, tokens, full) + _communication_items(s, tokens)
    if s.model.is_moe:
        notes.append("MoE layers are planned as transformers 5.24 runs them (grouped_mm over fused experts, no "
                     "capacity padding): the routed tokens' buffers scale with experts per token.")
    if s.packing and not s.flash:
        notes.append(f"data.packing with {'eager' if s.eager else 'sdpa'} attention: each micro-batch becomes one row "
                     f"of up to {span} tokens whose block-diagonal mask is materialised, so the span^2 terms grow "
                     f"with the micro-batch; flash attention runs packed rows without a mask.")
    elif not s.eager and not s.flash:
        notes.append("sdpa: counts the per-layer additive mask made from a padding mask; "
                     "unpadded batches skip it (is_causal).")
    return items, host, notes


def _layer_source(s: _Setup) -> str:
    """korthikanti for a dense attention model; the layer-kind terms' key when any layer is MoE, MLA or linear."""
    kinds = s.model.layer_kinds
    if any(kind.mlp == "moe" or kind.mixer != "attention" for kind in kinds):
        return "layer-kinds"
    return "korthikanti"


def _finished_layer_gradients(s: _Setup, kept_per_layer: float) -> list[Item]:
    """Full fine-tuning, gradients freed between steps: as the backward walks down the layers, each finished layer
    frees what it kept (``kept_per_layer``: its saved activations, or its checkpointed input) and leaves its
    gradients.  At layer k, (L-1-k) layers' gradients and (k+1) layers' kept tensors are live; the larger end is
    k = 0 where a layer's gradients outweigh what it kept: (L-1) x (gradients - kept) more than the plan's
    all-kept moment."""
    f = s.facts
    extra = (f.num_layers - 1) * (_layer_params(f) * s.weight_bytes - kept_per_layer)
    if extra <= 0:
        return []
    return [Item("gradients of the finished layers, beyond the activations they freed", "gradients", extra,
                 LAYER_BACKWARD, source="torch-autograd")]


def _sequence_label(s: _Setup) -> str:
    """', sequence 1/4 by cp' where a sequence is split across ranks; '' otherwise."""
    if s.seq_shards == 1:
        return ""
    return f", sequence 1/{s.seq_shards} by {'cp' if s.distributed == 'fsdp' else 'sp'}"


def _activation_label(s: _Setup) -> str:
    """How one rank's share of the saved activations is split: the attention core and the MLP's intermediates by tp
    (the layer inputs, norms and residual stay whole: neither backend shards them along the sequence), every token
    by cp or sp."""
    parts = [f"attention and MLP tp 1/{s.tp}"] if s.tp > 1 else []
    if s.seq_shards > 1:
        parts.append(_sequence_label(s)[2:])
    return ", ".join(parts)


def _communication_items(s: _Setup, tokens: int) -> list[Item]:
    """The buffers tensor, context and sequence parallelism add while one layer's backward runs (``tokens``: this
    rank's); each layer's forward holds the same or less, and NCCL's own buffers are counted as overhead."""
    f, m, a = s.facts, s.model, s.act_bytes
    items = []
    if s.tp > 1:  # o_proj and down_proj end in an all-reduce of the layer's output; q/k/v and gate/up's input grads too
        items.append(Item(f"tensor-parallel all-reduce of a layer's output over the {s.tp} ranks (tokens x h)",
                          "activations", tokens * f.hidden_size * a, LAYER_BACKWARD, source="megatron-tp"))
    if s.seq_shards > 1 and s.distributed == "deepspeed":  # Ulysses: all-to-all of q, k, v in and the output back
        items.append(Item("Ulysses all-to-all buffers of one layer (q, k, v and the attention output)", "activations",
                          tokens * (2 * m.q_dim + 2 * m.kv_dim) / s.tp * a, LAYER_BACKWARD, source="ulysses"))
    elif s.seq_shards > 1:  # torch's context_parallel, Accelerate's default allgather rotation
        whole = tokens * s.seq_shards
        items.append(Item("context-parallel K and V of the whole sequence, gathered for one layer, and their fp32 "
                          "gradients", "activations", whole * 2 * f.kv_dim * (a + 4), LAYER_BACKWARD,
                          source="torch-cp"))
    return items


def _eval_items(s: _Setup) -> list[Item]:
    """An evaluation batch (per_device_eval_batch_size = the micro-batch) of the Trainer's ``prediction_step``: eval
    mode, no gradients, so nothing is saved for backward.  Live beside the weights and optimizer states: the hidden
    states, and the larger of one layer's forward transient (SwiGLU's gate, up and product, or eager's scores) and
    the loss, which runs after the last layer: the logits built whole (a), their fp32 upcast (4, none when they are
    fp32 already) and the fp32 log-softmax (4) -- unless a fused or chunked loss runs.  Traced with
    :func:`tuner.planner.simulate.simulate` (``evaluation=True``).
    """
    from tuner.planner.preference import head_transient_bytes

    f = s.facts
    tokens = s.batch * s.seq
    if s.rollout:  # grpo evaluates by generating
        from tuner.planner.grpo import eval_items

        return eval_items(s)
    if s.objective != "sft":  # TRL's fused log-prob head, forward only
        loss = Item("evaluation: the fused log-prob head's forward tiles", "logits_loss",
                    head_transient_bytes(s, tokens, backward=False), EVAL, source="trl-fused-head")
    elif s.liger or s.chunked_loss:
        rows = min(tokens, _next_power_of_two(tokens / math.ceil(f.vocab_size / f.hidden_size)))
        loss = Item("evaluation: one logits chunk of the fused loss", "logits_loss", rows * f.vocab_size * 4, EVAL,
                    source="liger" if s.liger else "torch-lce")
    else:
        upcast = 4 if s.act_bytes != 4 else 0
        softcap = s.act_bytes if f.final_logit_softcapping else 0  # tanh's output, before the loss
        loss = Item("evaluation: logits, fp32 upcast and log-softmax (no gradients)", "logits_loss",
                    tokens * f.vocab_size * (s.act_bytes + upcast + 4 + softcap), EVAL, source="hf-loss")
    layer = largest(_eval_layer_bytes, s, tokens)
    # the residual stream, the layer's normalised input, and the embeddings' output the model's forward holds
    hidden = Item("evaluation: hidden states (residual, the layer's input, the embedding output)", "activations",
                  3 * tokens * f.hidden_size * residual_bytes(s), EVAL, source="korthikanti")
    if layer > loss.bytes:
        return [hidden, Item("evaluation: one layer's forward transient (no gradients)", "activations", layer, EVAL,
                             source="korthikanti")]
    return [hidden, loss]


def _eval_layer_bytes(s: _Setup, kind, tokens: int) -> float:
    """One layer's forward transient without gradients (tuner.planner.layers); LoRA on the MLP's gate/up adds
    PEFT's ``result + lora_B(...) * scaling``: the base output, the branch and its scaled copy at once (a fused
    gate_up_proj's output is both halves)."""
    layer = forward_transient_bytes(s, kind, tokens)
    if any(lin.is_nn_linear and lin.name.split(".")[-1] in ("gate_proj", "up_proj", "gate_up_proj")
           for lin in lora_linears(s, kind)):
        width = mlp_width(s, kind) if kind.mlp == "dense" else kind.dims.get("shared_width", 0) / s.tp
        layer += (2 if kind.dims.get("fused_gate_up") else 1) * tokens * width * s.act_bytes
    return layer


# ---------------------------------------------------------------- phases beyond the training step

def _merge_items(s: _Setup) -> list[Item]:
    """Merging the adapter into its base (output.save merged/full, on rank 0 after training; ``tuner merge`` the
    same): the base loaded unquantised in model.dtype on the CPU, plus the fp32 adapter (tuner.loading.merge)."""
    if s.kind == "full" or s.save not in ("merged", "full"):
        return []
    f = s.model
    return [Item("merging: base model in model.dtype and the fp32 adapter (rank 0)", "weights",
                 f.total_params * s.weight_bytes + _trainable_lora(s, f) * 4, MERGE,
                 source="peft-merge")]


def _host_phase_items(s: _Setup) -> tuple[list[Item], list[str]]:
    """Host RAM of one machine (of a GPU recipe) while loading, saving and resuming; ``gpus_per_machine``
    processes share it; the weights are loaded, saved and resumed whole."""
    f = s.model
    total, per_machine, n = f.total_params, max(s.gpus_per_machine, 1), s.world
    lora_bytes = 0 if s.kind == "full" else _trainable_lora(s, f) * 4
    deepspeed, fsdp = s.distributed == "deepspeed" and s.zero is not None, s.distributed == "fsdp"
    w16 = 2 if s.mixed else 4  # DeepSpeed's module dtype
    master = 4 if s.mixed or s.weight_bytes == 4 else s.weight_bytes  # FSDP parameters after Accelerate's upcast
    trainable = total if s.kind == "full" else _trainable_lora(s, f)
    notes, items = [], []
    # loading: from_pretrained materialises the weights on the CPU in every process before they move to the GPU
    if deepspeed and s.zero == 3:
        items.append(Item(f"loading: each process keeps its 1/{n} partition (ZeRO-3 zero.Init)", "weights",
                          total * s.weight_bytes / n * per_machine, LOAD, source="hf-deepspeed"))
        notes.append("ZeRO-3 loading also reads whole checkpoint shards in every process; the plan counts the "
                     "partitions only.")
    elif fsdp and s.fsdp_ram_efficient_loading:
        items.append(Item("loading: weights on the first process only (fsdp.cpu_ram_efficient_loading)", "weights",
                          total * s.weight_bytes, LOAD, source="fsdp"))
    else:
        items.append(Item(f"loading: weights materialised on the CPU by each of {per_machine} process(es)", "weights",
                          total * s.weight_bytes * per_machine, LOAD, source="hf-loading"))
    # saving: what rank 0 gathers or copies into host RAM before it writes
    if deepspeed and s.zero == 3:
        items.append(Item("saving: 16-bit weights gathered on rank 0 (stage3_gather_16bit_weights_on_model_save)",
                          "weights", total * w16, SAVE, source="ds-save"))
    elif fsdp:
        if s.fsdp_full_state_dict:  # sharded: each rank writes its own shard, nothing is gathered
            items.append(Item("saving: full state dict gathered on rank 0 (fsdp.state_dict_type: full)", "weights",
                              total * master, SAVE, source="fsdp"))
    elif s.kind == "full":
        weights = total * (w16 if deepspeed else s.weight_bytes)
        items.append(Item("saving: safetensors copies a shard (up to 50 GB) into host RAM on rank 0", "weights",
                          min(weights, SAFETENSORS_SHARD_BYTES), SAVE, source="safetensors"))
    else:
        items.append(Item("saving: the adapter on rank 0", "lora_adapter", lora_bytes, SAVE, source="peft"))
    # resuming: checkpoints are read into host RAM by every process before they reach the GPU
    if not s.resumable:
        pass
    elif deepspeed:
        model_states = total * w16 / (n if s.zero == 3 else 1) if s.kind == "full" else lora_bytes
        optimizer = trainable * 12 / (n if s.zero >= 1 else 1)
        items.append(Item("resuming: each process loads its model states and optimizer partition to the CPU",
                          "optimizer", (model_states + optimizer) * per_machine, RESUME, source="ds-checkpoint"))
    elif fsdp and s.fsdp_full_state_dict:
        items.append(Item("resuming: full model and optimizer state dicts loaded on rank 0", "optimizer",
                          total * master + trainable * 2 * master, RESUME, source="fsdp"))
    elif fsdp:
        items.append(Item("resuming: each process reads its model and optimizer shards", "optimizer",
                          (total + trainable * 2) * master / n * per_machine, RESUME, source="fsdp"))
    elif s.kind == "full":
        items.append(Item("resuming: each process loads the checkpoint's weights to the CPU", "weights",
                          total * s.weight_bytes * per_machine, RESUME, source="hf-loading"))
    else:
        items.append(Item("resuming: each process loads the adapter", "lora_adapter", lora_bytes * per_machine,
                          RESUME, source="peft"))
    return items + _merge_items(s), notes


def _cpu_phase_items(s: _Setup) -> list[Item]:
    """On a CPU recipe, per process: resuming full weights reads a copy before load_state_dict copies it in."""
    if s.kind != "full" or not s.resumable:
        return []
    return [Item("resuming: the checkpoint's weights read before they are copied in", "weights",
                 s.model.total_params * s.weight_bytes, RESUME, source="hf-loading")]


# ---------------------------------------------------------------- the plan

def _overhead_items(s: _Setup, tensors: float, loss_bytes: float) -> list[Item]:
    if not s.on_gpu:
        return [Item("Python, torch and transformers in the process", "overhead", CPU_PROCESS_GIB * GIB,
                     source="measured", level="device")]
    items = [Item("CUDA context and library workspaces", "overhead", CUDA_CONTEXT_GIB * GIB, source="measured",
                  level="device")]
    if s.world > 1:
        items.append(Item("NCCL communicator buffers", "overhead", NCCL_GIB * GIB, source="nccl", level="device"))
    return items + _allocator_items(tensors, loss_bytes)


def _allocator_items(tensors: float, loss_bytes: float) -> list[Item]:
    """What PyTorch's caching allocator reserves beyond the live tensors (max_memory_reserved - allocated).

    The loss path allocates T x V buffers of two sizes (16-bit logits and their gradient, fp32 upcast,
    log-softmax and its gradients); a freed fp32 block split by a 16-bit request cannot take the next fp32
    one, so a whole fp32 logits segment (a third of the 12 T x V bytes of the loss buffers) stays cached through
    the forward/backward.  When the peak is the optimizer step, the gradients, AdamW states and foreach
    temporaries (parameter-shaped) fill the segments the loss buffers left only in part: all of them count.
    Measured on an H200 (docs/memory.md); a fused or chunked loss scales both with its own buffers.
    """
    rounding = Item(f"caching-allocator rounding and split blocks ({ALLOCATOR_ROUNDING:.0%} of tensors)", "overhead",
                    ALLOCATOR_ROUNDING * tensors, source="allocator", level="reserved")
    if not loss_bytes:  # TRL's fused head (dpo/kto) reuses one tile buffer: no loss segments to cache
        return [rounding]
    return [
        rounding,
        Item("cached fp32 logits segment (a third of the loss buffers)", "overhead", loss_bytes / 3, BACKWARD,
             source="allocator", level="reserved"),
        Item("cached segments of the loss buffers, partly refilled by the step", "overhead", loss_bytes, STEP,
             source="allocator", level="reserved"),
    ]


def _capacity(recipe) -> tuple[float | None, str]:
    hw = recipe.hardware
    if hw.gpu_memory_gb:
        return float(hw.gpu_memory_gb), hw.gpu or f"{hw.gpu_memory_gb:g}GB"
    if hw.gpu:
        from tuner.catalog.gpus import lookup_gpu

        spec = lookup_gpu(hw.gpu)
        return spec.memory_gib, spec.name
    return None, "GPU"


def _host_ram(recipe) -> float | None:
    if recipe.hardware.host_ram_gb:
        return float(recipe.hardware.host_ram_gb)
    if recipe.uses_gpu:
        return None  # the planning machine's RAM says nothing about the training machines
    import psutil

    return psutil.virtual_memory().total / GIB


def plan(recipe) -> MemoryPlan:
    """Predict the peak memory of every phase of ``recipe``'s run on each device, with a verdict."""
    s = _setup(recipe)
    f = s.facts
    gpu_items, host_per_gpu, notes = _model_state_items(s)
    saved_items, saved_notes = _trained_outside_layers_items(s)
    gpu_items, notes = gpu_items + saved_items, notes + saved_notes
    if s.objective != "sft":
        from tuner.planner.preference import fold_note, reference_items

        on_gpu, on_host = reference_items(s, gpu_items, host_per_gpu)
        gpu_items, host_per_gpu = gpu_items + on_gpu, host_per_gpu + on_host
        notes += fold_note(s)
    act_items, act_host, act_notes = _activation_items(s)
    notes += list(f.notes) + act_notes
    items = gpu_items + act_items + (_eval_items(s) if s.evaluates else [])
    capacity, gpu_name = _capacity(recipe)
    if s.rollout:
        from tuner.planner.grpo import rollout_items

        items = rollout_items(s, items, capacity if s.on_gpu else None)
    peak = DevicePlan("probe", None, items).total_gib * GIB
    # the allocator caches T x V loss segments; TRL's fused head (dpo/kto) reuses one tile buffer instead
    loss_bytes = sum(i.bytes for i in act_items if i.category == "logits_loss") if s.objective == "sft" else 0.0
    items += _overhead_items(s, peak, loss_bytes)

    devices: list[DevicePlan] = []
    host_ram = 0.0
    generation = (GENERATION,) if s.rollout else ()
    if s.on_gpu:
        devices.append(DevicePlan(f"GPU ({s.world} x {gpu_name})" if s.world > 1 else f"GPU ({gpu_name})",
                                  capacity, items, count=s.world, kind="gpu", phases=GPU_PHASES + generation))
        if s.rollout and s.rollout.backend == "vllm_server" and capacity:
            from tuner.planner.grpo import server_items

            devices.append(DevicePlan(f"vLLM server GPU ({s.rollout.vllm_gpus} x {gpu_name})",
                                      s.rollout.vllm_share * capacity, server_items(s, capacity),
                                      count=s.rollout.vllm_gpus, kind="vllm", phases=(TRAINING_STEP,)))
        per_machine = max(s.gpus_per_machine, 1)
        phase_items, phase_notes = _host_phase_items(s)
        host_items = [i.scaled(per_machine, AFTER_LOADING) for i in host_per_gpu] + \
            [i.scaled(per_machine) for i in act_host] + phase_items
        host = DevicePlan(f"host RAM (per machine, {per_machine} GPU(s))", _host_ram(recipe), host_items, kind="host")
        host_ram = host.total_gib
        devices.append(host)
        notes += phase_notes
        if host.capacity_gib is None:
            notes.append(f"host RAM per machine peaks at {host.total_gib:.1f} GiB while {host.moment}; set "
                         "hardware.host_ram_gb to check it against the machines' RAM.")
        if "nvme" in (s.offload_optimizer, s.offload_params):
            notes.append("NVMe offload: the offloaded states live on disk; host RAM then holds only pinned swap "
                         "buffers, which this plan does not model.")
    else:
        processes = s.world
        scaled = [i.scaled(processes) for i in items + _cpu_phase_items(s)] if processes > 1 else \
            items + _cpu_phase_items(s)
        devices.append(DevicePlan("CPU RAM" + (f" ({processes} processes)" if processes > 1 else ""),
                                  _host_ram(recipe), scaled + _merge_items(s), count=1, kind="cpu",
                                  phases=CPU_PHASES + generation))
    if s.objective != "sft" and s.precompute:
        from tuner.planner.preference import reference_pass_items

        training = devices[0]
        process = [i for i in items if i.source in ("measured", "nccl")]  # the process, not its tensors
        pass_items = reference_pass_items(s, gpu_items, process)
        devices.append(DevicePlan(f"{training.name}, reference log-prob pass before training", training.capacity_gib,
                                  [i.scaled(s.world) for i in pass_items] if not s.on_gpu else pass_items,
                                  count=training.count, kind="pass"))
    notes += list(s.kernel_notes) + _setting_notes(recipe, s)

    verdict, missing = _verdict(devices)
    unmodelled = list(s.model.unmodelled)
    if unmodelled:
        verdict, missing = CANNOT_JUDGE, 0.0
        notes.insert(0, f"no verdict: tuner has no memory terms for {'; '.join(unmodelled)}, so the figures above "
                        "leave them out; `tuner plan --simulate` traces the real step on fake tensors.")
    counts = s.model.param_counts
    trainable = counts.total if s.kind == "full" else _trainable_lora(s, f) + sum(
        (_module_params(s, name) or (0, 0))[0] for name in s.modules_to_save)
    return MemoryPlan(model=recipe.model.id, devices=devices, verdict=verdict, missing_gib=missing,
                      host_ram_gib=host_ram, notes=notes, params=counts.as_dict(), trainable_params=trainable,
                      micro_batch_size=recipe.memory.micro_batch_size, max_seq_length=recipe.memory.max_seq_length,
                      unmodelled=unmodelled)


MODEL_STATES = ("weights", "gradients", "optimizer")


def rank_model_states(recipe, moment: str = STEP) -> dict[str, float]:
    """Bytes of weights, gradients and optimizer states one rank holds at ``moment`` (default: the optimizer step),
    as the plan counts them: split by tp, then sharded by ZeRO/FSDP over the data-parallel ranks.  The same items
    as :func:`plan`'s (activations, buffers and overhead left out), for comparing with a per-rank trace."""
    items, _, _ = _model_state_items(_setup(recipe))
    return {category: sum(i.bytes for i in items if i.category == category and i.live_in(moment))
            for category in MODEL_STATES}


def _setting_notes(recipe, s: _Setup) -> list[str]:
    """What the recipe sets that changes memory in ways the plan models only in part (or not at all)."""
    f, mem = s.model, recipe.memory
    notes = []
    if s.quant_bits and s.distributed in ("fsdp", "deepspeed") and (s.distributed == "fsdp" or s.zero == 3):
        notes.append("QLoRA sharded with ZeRO-3/FSDP stores 4-bit weights as the compute dtype "
                     "(bnb_4bit_quant_storage); tuner's loader sets it.")
    if s.quant_bits and f.is_moe:
        notes.append("bitsandbytes quantises only nn.Linear layers: the fused MoE experts of transformers v5 stay "
                     "unquantised, and k-bit preparation casts them to fp32.")
    if s.mixed and s.kind == "full" and s.distributed in ("none", "ddp") and s.weight_bytes == 2:
        notes.append("16-bit weights with 16-bit AdamW states (no fp32 master copy), as the Hugging Face Trainer "
                     "does for bf16 weights; load float32 weights for classic mixed precision.")
    if not s.mixed and s.weight_bytes == 2 and s.kind != "full":
        notes.append("16-bit weights without autocast: PEFT keeps the adapters in fp32 (autocast_adapter_dtype), "
                     "casts each adapted layer's input to fp32 and adds the fp32 branch to the 16-bit output, so the "
                     "LoRA branches, their gradients and AdamW states are fp32 while the rest runs in "
                     f"{recipe.model.dtype}; counted so.")
    if mem.liger and not s.on_gpu:
        notes.append("memory.liger: Liger's Triton kernels need a GPU; a CPU run trains without them, and so does "
                     "this plan.")
    elif s.liger:
        notes.append("memory.liger: counts Liger's fused RMSNorm, SwiGLU and linear cross-entropy by their published "
                     "formulas (not measured here); it assumes liger-kernel is installed on the training machines and "
                     f"supports model_type {f.model_type!r}, else the run trains without them and needs more.")
    if mem.torch_compile:
        notes.append("memory.torch_compile: not modelled; inductor fuses element-wise ops and usually saves "
                     "activation memory, so the plan errs high (and the first steps compile).")
    if s.chunked_loss and s.on_gpu:
        notes.append("memory.chunked_loss: torch's chunked linear cross-entropy on CUDA is counted by its "
                     "buffer layout (compact, aspect_ratio:2), checked against CPU traces; not measured on a GPU.")
    if s.activation_offloading:
        notes.append("memory.activation_offloading: the checkpointed layer inputs live in pinned host RAM "
                     "(counted on the host device); each crosses PCIe twice per step.")
    return notes


def _verdict(devices: list[DevicePlan]) -> tuple[str, float]:
    checked = [d for d in devices if d.capacity_gib is not None]
    if not checked:
        return "unknown", 0.0
    missing = max(max(-(d.headroom_gib or 0.0), 0.0) for d in checked)
    if missing > 0:
        return "does not fit", missing
    if any(d.headroom_gib < TIGHT_HEADROOM * d.capacity_gib for d in checked):
        return "tight", 0.0
    return "fits", 0.0
