"""Model states: weights, adapters, gradients and optimizer states per rank, under ZeRO/FSDP sharding, offload
and quantisation, with the parameters trained outside the decoder layers."""
from __future__ import annotations

from dataclasses import replace

from tuner.catalog.facts import ModelFacts
from tuner.catalog.peft_targets import peft_saves
from tuner.planner.items import (ALWAYS, EVAL, LAYER_BACKWARD, STEP, BACKWARD, NF4_DOUBLE_QUANT_BYTES, NF4_BYTES,
                                 ADAM8BIT_BYTES, ZERO3_MAX_LIVE_PARAMETERS, Item)
from tuner.planner.expert_parallel import gathered_layer_params
from tuner.planner.layers import largest
from tuner.planner.rank_setup import Setup


def _largest_module_params(facts: ModelFacts) -> int:
    """Parameters of the largest single module (what ZeRO-3 gathers at once: every expert of a MoE layer, whose
    experts transformers fuses into one tensor), as DeepSpeed's estimator counts."""
    return facts.largest_module_params()


def layer_params(facts: ModelFacts) -> float:
    """Parameters of the largest decoder layer (FSDP's unit), one tensor-parallel rank's share of it."""
    whole = facts.largest_layer_params()
    if facts.tp == 1:
        return whole
    rank, model = facts.param_counts, replace(facts, tp=1).param_counts
    return whole * (rank.attention + rank.mlp + rank.norms) / max(model.attention + model.mlp + model.norms, 1)


def trainable_lora(s: Setup, facts: ModelFacts | None = None) -> int:
    """LoRA parameters PEFT adds for the recipe's targets (one rank's share of them under tensor parallelism),
    inside the parts ``method.train`` names."""
    return (facts or s.facts).lora_params(s.lora_r, s.lora_targets, s.lora_parameters, s.train)


def trainable_full(s: Setup) -> int:
    """Parameters a full fine-tune trains: all of them, but the frozen parts of an image-text model."""
    return s.counts.total - s.model.frozen_params(s.train)


def _frozen_weight_items(s: Setup) -> list[Item]:
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


def _frozen_autocast_copies(s: Setup) -> list[Item]:
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


def model_state_items(s: Setup) -> tuple[list[Item], list[Item], list[str]]:
    """(GPU items, host items per GPU, notes) for weights, adapters, gradients and optimizer states."""
    f, counts = s.facts, s.counts
    notes: list[str] = []
    full = s.kind == "full"
    trainable = trainable_full(s) if full else trainable_lora(s, f)
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
            layer, experts = layer_params(f), ""
            if s.experts:  # under ep FSDP gathers a layer's dense part and only this rank's experts
                layer = gathered_layer_params(s.experts, layer)
                experts = f", {s.experts.experts_per_rank} of {s.experts.experts} experts (ep {s.experts.ep})"
            gpu.append(Item(f"gathered parameters (root module + two decoder layers{experts})" + s.tp_label,
                            "weights", (root + 2 * layer) * compute, BACKWARD, source="fsdp"))
    else:
        if full:
            gpu.append(Item("parameters", "weights", counts.total * s.weight_bytes, source="dtype"))
            if s.mixed and s.weight_bytes == 4:
                linear = counts.attention + counts.mlp + (counts.lm_head or counts.embeddings)
                # autocast caches the casts of leaves that require grad until its region exits: kept for the
                # backward, and through an evaluation forward (no_grad does not stop the cache)
                gpu.append(Item("autocast 16-bit copies of fp32 linear weights", "weights", linear * 2,
                                BACKWARD + (EVAL,), source="autocast"))
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
                layer = gathered_layer_params(s.experts, layer_params(f)) if s.experts else layer_params(f)
                module = head + max(layer, counts.embeddings if counts.lm_head else 0)
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


def module_params(s: Setup, name: str) -> tuple[int, int] | None:
    """(parameters, largest tensor) of the modules PEFT matches by ``name`` (as ``_set_trainable`` does:
    :func:`tuner.catalog.peft_targets.peft_saves`); None for a name tuner cannot size."""
    f, counts = s.facts, s.counts
    head = f.vocab_size * f.hidden_size
    if name == "lm_head":
        return head, head  # a tied head gets its own copy, untied from the embeddings
    if name in ("embed_tokens", "model.embed_tokens"):
        return counts.embeddings, counts.embeddings
    if name in ("norm", "layernorm") and f.inventory is not None:
        # the norm modules PEFT matches by that name (before PEFT 0.22 every path ending so: q/k norms too)
        norms = [group for group in f.inventory.groups if group.kind == "norm" and peft_saves(group.pattern, name)]
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


def trained_outside_layers_items(s: Setup) -> tuple[list[Item], list[str]]:
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
        sized = module_params(s, name)
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
