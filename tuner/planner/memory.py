"""The analytic memory model: bytes per device for one training step, term by term.

Pure arithmetic on a recipe and the model's architecture facts; no torch import, so a
plan answers in milliseconds.  Every item carries the key of its formula's source,
explained in ``docs/memory.md``.

Each item is live ``always`` (weights, optimizer states) or in some of three moments
of a step: ``loss`` (end of the forward: saved activations plus the logits and loss
buffers), ``layer backward`` (backward through one decoder layer, recomputed under
gradient checkpointing) and ``optimizer step`` (the full gradients and the optimizer's
temporaries, when gradients are freed between steps).  The peak is ``always`` plus the
largest moment; a device's ``terms`` are what is live at that peak, so they add up to its total.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from tuner.catalog.models import ModelFacts, model_facts

GIB = 2**30
TIGHT_HEADROOM = 0.10  # less than 10% of a device left free is "tight": fragmentation and spikes can still OOM

CATEGORIES = ("weights", "reference_model", "lora_adapter", "gradients", "optimizer", "activations", "logits_loss",
              "overhead")
ALWAYS, FORWARD_BACKWARD, LAYER_BACKWARD, STEP = "always", "loss", "layer backward", "optimizer step"
MOMENTS = (FORWARD_BACKWARD, LAYER_BACKWARD, STEP)
BACKWARD = (FORWARD_BACKWARD, LAYER_BACKWARD)  # live from the forward until the backward ends

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
NF4_DOUBLE_QUANT_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4 bits + 8-bit absmax per 64 + fp32 absmax per 256 blocks = 4.127 bits
NF4_BYTES = 0.5 + 4 / 64  # 4 bits + fp32 absmax per 64-value block = 4.5 bits
ADAM8BIT_BYTES = 2 + 2 * 4 / 256  # two 1-byte moments + an fp32 absmax per 256-value block each
CUDA_CONTEXT_GIB = 0.75  # CUDA context, cuBLAS/cuDNN handles and workspaces of one process (measured on an H200)
NCCL_GIB = 0.5  # NCCL communicator buffers when several GPUs talk
ALLOCATOR_ROUNDING = 0.02  # caching allocator: rounding, small-block pools, split remainders (share of tensors)
CPU_PROCESS_GIB = 1.0  # a Python process with torch and transformers imported, before any tensor


@dataclass(frozen=True)
class Item:
    """One memory consumer on one device."""

    name: str
    category: str
    bytes: float
    phase: str | tuple[str, ...] = ALWAYS  # ALWAYS, one moment, or a tuple of moments
    source: str = ""

    def live_in(self, moment: str) -> bool:
        return self.phase == ALWAYS or self.phase == moment or (isinstance(self.phase, tuple) and moment in self.phase)

    @property
    def gib(self) -> float:
        return self.bytes / GIB


@dataclass
class DevicePlan:
    """Memory of one device (every GPU of a data-parallel run holds the same; ``count`` says how many)."""

    name: str
    capacity_gib: float | None
    items: list[Item]
    count: int = 1
    kind: str = "gpu"  # gpu, cpu (training on the CPU) or host (offload target)
    phase: str = ALWAYS  # the phase of the peak
    terms: dict[str, float] = field(default_factory=dict)
    total_gib: float = 0.0

    def __post_init__(self):
        self.phase = max(MOMENTS, key=lambda moment: sum(i.bytes for i in self.items if i.live_in(moment)))
        live = self.live_items
        self.terms = {c: sum(i.bytes for i in live if i.category == c) / GIB for c in CATEGORIES}
        self.total_gib = sum(self.terms.values())

    @property
    def headroom_gib(self) -> float | None:
        return None if self.capacity_gib is None else self.capacity_gib - self.total_gib

    @property
    def live_items(self) -> list[Item]:
        return [i for i in self.items if i.live_in(self.phase)]

    def to_dict(self) -> dict:
        return {
            "name": self.name, "kind": self.kind, "count": self.count, "peak_phase": self.phase,
            "capacity_gib": _round(self.capacity_gib), "total_gib": _round(self.total_gib),
            "headroom_gib": _round(self.headroom_gib),
            "terms_gib": {k: _round(v) for k, v in self.terms.items()},
            "items": [{"name": i.name, "category": i.category, "gib": _round(i.gib),
                       "phase": list(i.phase) if isinstance(i.phase, tuple) else i.phase,
                       "live_at_peak": i.live_in(self.phase), "source": i.source} for i in self.items],
        }


@dataclass
class MemoryPlan:
    """The predicted peak memory of a recipe on its hardware, with a verdict."""

    model: str
    devices: list[DevicePlan]
    verdict: str  # "fits", "tight" or "does not fit"
    missing_gib: float
    host_ram_gib: float  # host RAM each machine needs for offloaded states (0 without offload)
    notes: list[str]
    params: dict[str, int]
    trainable_params: int
    micro_batch_size: int
    max_seq_length: int

    @property
    def fits(self) -> bool:
        return self.verdict != "does not fit"

    @property
    def gpu(self) -> DevicePlan:
        """The training device (a GPU, or the CPU for CPU recipes)."""
        return self.devices[0]

    def to_dict(self) -> dict:
        return {
            "units": {"memory": "GiB (2^30 bytes)", "params": "parameters"},
            "model": self.model, "verdict": self.verdict, "missing_gib": _round(self.missing_gib),
            "host_ram_gib": _round(self.host_ram_gib), "params": self.params,
            "trainable_params": self.trainable_params, "micro_batch_size": self.micro_batch_size,
            "max_seq_length": self.max_seq_length,
            "devices": [d.to_dict() for d in self.devices], "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True)
class _Setup:
    """The recipe reduced to what the memory model reads."""

    facts: ModelFacts
    kind: str  # full, lora, qlora
    weight_bytes: int  # model.dtype
    act_bytes: int  # activations: 16-bit under mixed precision, else the weights' dtype
    mixed: bool
    distributed: str
    zero: int | None
    fsdp: str
    world: int
    shard_group: int
    offload_optimizer: str
    offload_params: str
    checkpointing: bool
    eager: bool
    flash: bool
    batch: int
    seq: int
    accumulation: int
    optimizer: str
    lora_r: int
    lora_targets: object
    lora_dropout: float
    quant_bits: int | None
    double_quant: bool
    on_gpu: bool
    gpus_per_machine: int
    objective: str = "sft"  # sft, or a preference objective (tuner.planner.preference)
    precompute: bool = False  # preference: reference log-probabilities computed before training


def _setup(recipe) -> _Setup:
    mem, method = recipe.memory, recipe.method
    quant = method.quantization
    weight_bytes = DTYPE_BYTES[recipe.model.dtype]
    mixed = mem.mixed_precision != "no"
    world = recipe.world_size
    objective = recipe.objective
    from tuner.planner.preference import sequences_per_sample

    return _Setup(
        facts=model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code),
        kind=method.kind, weight_bytes=weight_bytes, act_bytes=2 if mixed else weight_bytes, mixed=mixed,
        distributed=mem.distributed, zero=mem.zero_stage, fsdp=mem.fsdp.sharding_strategy, world=world,
        shard_group=min(world, recipe.hardware.gpus_per_machine) if mem.fsdp.sharding_strategy == "hybrid_shard" else world,
        offload_optimizer=mem.offload_optimizer, offload_params=mem.offload_params,
        checkpointing=mem.gradient_checkpointing, eager=mem.attention == "eager",
        flash=mem.attention == "flash" and recipe.uses_gpu,
        batch=mem.micro_batch_size * sequences_per_sample(objective.kind), seq=mem.max_seq_length,
        accumulation=mem.gradient_accumulation_steps, optimizer=mem.optimizer, lora_r=method.lora.r,
        lora_targets=method.lora.target_modules,
        lora_dropout=0.0 if objective.preference else method.lora.dropout,  # TRL turns dropout off
        quant_bits=quant.bits if quant and method.kind == "qlora" else None,
        double_quant=bool(quant and quant.double_quant), on_gpu=recipe.uses_gpu,
        gpus_per_machine=recipe.hardware.gpus_per_machine, objective=objective.kind,
        precompute=objective.precompute_ref_log_probs,
    )


# ---------------------------------------------------------------- model states

def _largest_module_params(facts: ModelFacts) -> int:
    """Parameters of the largest single module (what ZeRO-3 gathers at once), as DeepSpeed's estimator counts."""
    linears = [lin.weight_params for lin in facts.layer_linears()]
    return max([facts.vocab_size * facts.hidden_size, *linears])


def _layer_params(facts: ModelFacts) -> int:
    counts = facts.param_counts
    return (counts.attention + counts.mlp) // facts.num_layers + facts.architecture.norms_per_layer * facts.hidden_size


def _frozen_weight_items(s: _Setup) -> list[Item]:
    """Base weights of LoRA/QLoRA (frozen), before any sharding."""
    f, counts = s.facts, s.facts.param_counts
    if s.quant_bits is None:
        return [Item("base weights (frozen)", "weights", counts.total * s.weight_bytes, source="dtype")]
    quantized = f.quantizable_params()
    rows = sum(lin.out_features * lin.count for lin in f.layer_linears() if lin.is_nn_linear) * f.num_layers
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


def _model_state_items(s: _Setup) -> tuple[list[Item], list[Item], list[str]]:
    """(GPU items, host items per GPU, notes) for weights, adapters, gradients and optimizer states."""
    f, counts = s.facts, s.facts.param_counts
    notes: list[str] = []
    full = s.kind == "full"
    trainable = counts.total if full else f.lora_params(s.lora_r, s.lora_targets)
    deepspeed = s.distributed == "deepspeed" and s.world >= 1 and s.zero is not None
    fsdp = s.distributed == "fsdp"
    n = s.world
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
            base = Item("16-bit parameters" if s.mixed else "fp32 parameters", "weights", counts.total * w16, source="zero")
            frozen_items = [base]
        if s.zero == 3:
            for item in frozen_items:
                place(Item(item.name + f" (ZeRO-3 shard 1/{n})", item.category, item.bytes / n, item.phase, item.source),
                      s.offload_params)
            largest = _largest_module_params(f)
            gpu.append(Item("ZeRO-3 gathered live parameters (current + prefetched module)", "weights",
                            2 * 2 * largest, source="ds-estimator"))
            gpu.append(Item("ZeRO-3 prefetch and reduce buckets (0.9h^2 + h^2 elements)", "gradients",
                            1.9 * f.hidden_size**2 * w16, source="hf-deepspeed"))
        else:
            gpu.extend(frozen_items)
    elif fsdp:
        sharded = s.fsdp in ("full_shard", "hybrid_shard", "shard_grad_op")
        group = s.shard_group if sharded else 1
        master = 4 if s.mixed or s.weight_bytes == 4 else s.weight_bytes  # Accelerate upcasts FSDP params to fp32 under mixed precision
        if full:
            frozen_items = [Item("fp32 parameters (FSDP shard)" if master == 4 else "parameters (FSDP shard)",
                                 "weights", counts.total * master, source="fsdp")]
        for item in frozen_items:
            place(Item(item.name + (f" (shard 1/{group})" if group > 1 else ""), item.category, item.bytes / group,
                       item.phase, item.source), s.offload_params)
        compute = 2 if s.mixed else master
        if s.fsdp == "shard_grad_op":
            gpu.append(Item("unsharded 16-bit parameters kept through forward/backward", "weights",
                            counts.total * compute, BACKWARD, source="fsdp"))
        elif group > 1:
            root = counts.embeddings + counts.lm_head + f.hidden_size
            gpu.append(Item("gathered parameters (root module + two decoder layers)", "weights",
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
        grad_shard = n if s.zero >= 2 else 1
        grads16 = Item(f"{'16-bit' if s.mixed else 'fp32'} gradients" + (f" (partition 1/{grad_shard})" if grad_shard > 1 else ""),
                       "gradients", trainable * param_bytes / grad_shard, source="zero")
        if s.offload_optimizer != "none" and s.zero >= 2:
            # ZeRO-Offload reduces gradients through small GPU buckets straight into fp32 host buffers
            gpu.append(Item("gradient reduce buckets (h^2 elements)", "gradients", f.hidden_size**2 * param_bytes * 2,
                            source="hf-deepspeed"))
        else:
            gpu.append(grads16)
        opt_shard = n if s.zero >= 1 else 1
        opt_items = [Item("Adam moments (fp32)", "optimizer", trainable * 8 / opt_shard, source="zero")]
        if param_bytes != 4:
            opt_items.append(Item("fp32 master weights", "optimizer", trainable * 4 / opt_shard, source="zero"))
        if param_bytes != 4 or s.offload_optimizer != "none":
            # stage 1/2 upcast the whole gradient partition for the step; stage 3 one sub-group (1e9 elements) at a time
            step_elements = trainable / opt_shard if s.zero < 3 else min(trainable / opt_shard, 1e9)
            opt_items.append(Item("fp32 gradients for the step", "gradients", step_elements * 4, source="ds-estimator"))
        for item in opt_items:
            place(item, s.offload_optimizer)
    elif fsdp:
        shard = s.shard_group if s.fsdp != "no_shard" else 1
        place(Item("fp32 gradients (sharded)" if shard > 1 else "gradients", "gradients",
                   trainable * param_bytes / shard, ALWAYS if grad_persistent else STEP, source="fsdp"), s.offload_optimizer)
        place(Item("Adam moments", "optimizer", trainable * 2 * param_bytes / shard, source="torch-adamw"),
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


# ---------------------------------------------------------------- activations

def _lora_linears(s: _Setup):
    if s.kind == "full":
        return []
    return s.facts.lora_targets(s.lora_targets)


def layer_activation_bytes_per_token(s: _Setup) -> float:
    """Bytes autograd keeps per token for one decoder layer (Hugging Face Llama-style code path).

    Derived by walking the ops of the layer and what each saves for backward, and checked against
    fake-tensor traces (see docs/memory.md); terms that grow with the sequence length are in
    :func:`layer_score_bytes`.
    """
    f, a = s.facts, s.act_bytes
    h, inter, qd, kd = f.hidden_size, f.intermediate_size, f.q_dim, f.kv_dim
    full = s.kind == "full"
    # RMSNorm upcasts to fp32 (kept for pow/mul) and, when its weight trains, keeps the normalised input
    total = f.architecture.norms_per_layer * (4 * h + (a * h if full else 0))
    if full:
        total += a * h + a * qd  # inputs of q/k/v and of o_proj, kept for the weight gradients
    # attention core: q, k, v and the output (every kernel keeps them for backward)
    total += a * (2 * qd + 2 * kd)
    if not s.eager:
        total += 4 * f.num_heads  # fused kernels keep a log-sum-exp per head (fp32)
    # SwiGLU: gate output (SiLU input), SiLU output and up output (the product's operands);
    # full fine-tuning also keeps the MLP input and the down_proj input for the weight gradients
    mlp = 3 * a * inter + (a * h + a * inter if full else 0)
    if f.is_moe:  # each token runs through its top-k experts; the router's fp32 logits and softmax
        mlp = mlp * f.experts_per_token + 8 * f.num_experts
    total += mlp
    # LoRA branches, per targeted linear: the adapter's input in its compute dtype and its dropped-out
    # copy (with the mask); fitted to fake-tensor traces: in x (a + 2), plus in bytes with dropout
    targets = _lora_linears(s)
    if targets:
        lora_act = 2 if s.mixed else 4
        for lin in targets:
            total += lin.in_features * (lora_act + 2 + (1 if s.lora_dropout > 0 else 0)) + s.lora_r * lora_act
    return total


def layer_score_bytes_per_token(s: _Setup) -> float:
    """Per token and layer, the terms that grow with the sequence length s.

    eager keeps the fp32 softmax (and its 16-bit copy) of every head: (4 + a) x heads x s;
    sdpa receives the boolean causal/padding mask and converts it to an additive mask of the
    compute dtype in every layer (kept for backward): a x s.  flash-attention keeps neither.
    """
    f, a = s.facts, s.act_bytes
    if s.eager:
        return f.num_heads * s.seq * (4 + (a if a != 4 else 0))
    if s.flash:
        return 0.0
    return a * s.seq


def _activation_items(s: _Setup) -> tuple[list[Item], list[str]]:
    f, a = s.facts, s.act_bytes
    tokens = s.batch * s.seq
    per_layer = (layer_activation_bytes_per_token(s) + layer_score_bytes_per_token(s)) * tokens
    notes = []
    residual_bytes = 4 if (s.mixed and s.weight_bytes == 4) else a
    full = s.kind == "full"
    # final norm (fp32 upcast; normalised input when it trains), output-head input, rotary cos/sin
    final = tokens * f.hidden_size * (4 + (2 * a if full else a)) + s.seq * f.head_dim * 2 * a
    # the backward of one layer holds the gradients of the SwiGLU intermediates, then (eager) those of
    # the s x s probabilities and scores; the MLP's are freed before the attention's backward starts
    layer_backward = tokens * max(4 * a * f.intermediate_size * max(f.experts_per_token, 1),
                                  6 * f.num_heads * s.seq if s.eager else 0)
    items = []
    if s.checkpointing:
        items.append(Item(f"checkpointed layer inputs ({f.num_layers} layers)", "activations",
                          f.num_layers * tokens * f.hidden_size * residual_bytes, BACKWARD, source="korthikanti"))
        items.append(Item("one layer recomputed in backward", "activations", per_layer, LAYER_BACKWARD,
                          source="korthikanti"))
    else:
        items.append(Item(f"saved activations ({f.num_layers} layers)", "activations",
                          f.num_layers * per_layer, BACKWARD, source="korthikanti"))
    items.append(Item("gradients of one layer's intermediates", "activations", layer_backward, LAYER_BACKWARD,
                      source="torch-autograd"))
    if full and s.accumulation == 1 and s.distributed in ("none", "ddp"):
        # backward reaches the layers after the output head's gradient exists (sharded engines keep grad buffers)
        items.append(Item("gradient of the output head", "gradients", f.vocab_size * f.hidden_size * s.weight_bytes,
                          LAYER_BACKWARD, source="torch-autograd"))
    items.append(Item("final norm, output-head input, rotary tables", "activations", final, FORWARD_BACKWARD,
                      source="korthikanti"))
    if s.objective == "sft":
        # logits: the 16-bit/fp32 logits, log_softmax output (fp32) and two fp32 gradients of it in backward
        items.append(Item("logits and cross-entropy (s x b x V)", "logits_loss", tokens * f.vocab_size * 12,
                          FORWARD_BACKWARD, source="hf-loss"))
    else:
        from tuner.planner.preference import loss_items

        items += loss_items(s)
    if f.is_moe:
        notes.append("MoE activations are approximated (tokens routed to top-k experts, no capacity padding).")
    if not s.eager and not s.flash:
        notes.append("sdpa: counts the per-layer additive mask made from a padding mask; "
                     "unpadded batches on CUDA skip it (is_causal).")
    return items, notes


# ---------------------------------------------------------------- the plan

def _overhead_items(s: _Setup, tensors: float) -> list[Item]:
    if not s.on_gpu:
        return [Item("Python, torch and transformers in the process", "overhead", CPU_PROCESS_GIB * GIB, source="measured")]
    items = [Item("CUDA context and library workspaces", "overhead", CUDA_CONTEXT_GIB * GIB, source="measured")]
    if s.world > 1:
        items.append(Item("NCCL communicator buffers", "overhead", NCCL_GIB * GIB, source="nccl"))
    return items + _allocator_items(s, tensors)


def _allocator_items(s: _Setup, tensors: float) -> list[Item]:
    """What PyTorch's caching allocator reserves beyond the live tensors (max_memory_reserved - allocated).

    The loss path allocates T x V buffers of two sizes (16-bit logits and their gradient, fp32 upcast,
    log-softmax and its gradients); a freed fp32 block split by a 16-bit request cannot take the next fp32
    one, so a whole fp32 logits segment stays cached through the forward/backward.  When the peak is the
    optimizer step, the gradients, AdamW states and foreach temporaries (parameter-shaped) fill the
    segments the loss buffers left only in part: all of them count.  Measured on an H200 (docs/memory.md).
    """
    rounding = Item(f"caching-allocator rounding and split blocks ({ALLOCATOR_ROUNDING:.0%} of tensors)", "overhead",
                    ALLOCATOR_ROUNDING * tensors, source="allocator")
    if s.objective != "sft":  # TRL's fused head reuses one tile buffer: no T x V segments to cache
        return [rounding]
    logits = s.batch * s.seq * s.facts.vocab_size
    return [
        rounding,
        Item("cached fp32 logits segment (s x b x V)", "overhead", 4 * logits, BACKWARD, source="allocator"),
        Item("cached segments of the loss buffers, partly refilled by the step", "overhead", 12 * logits, STEP,
             source="allocator"),
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
    """Predict the peak memory of one training step of ``recipe`` on each device, with a verdict."""
    s = _setup(recipe)
    f = s.facts
    gpu_items, host_per_gpu, notes = _model_state_items(s)
    if s.objective != "sft":
        from tuner.planner.preference import reference_items

        on_gpu, on_host = reference_items(s, gpu_items, host_per_gpu)
        gpu_items, host_per_gpu = gpu_items + on_gpu, host_per_gpu + on_host
    act_items, act_notes = _activation_items(s)
    notes += list(f.notes) + act_notes
    items = gpu_items + act_items
    peak = DevicePlan("probe", None, items).total_gib * GIB
    items += _overhead_items(s, peak)

    devices: list[DevicePlan] = []
    if s.on_gpu:
        capacity, gpu_name = _capacity(recipe)
        devices.append(DevicePlan(f"GPU ({s.world} x {gpu_name})" if s.world > 1 else f"GPU ({gpu_name})",
                                  capacity, items, count=s.world, kind="gpu"))
    else:
        processes = s.world
        devices.append(DevicePlan("CPU RAM" + (f" ({processes} processes)" if processes > 1 else ""),
                                  _host_ram(recipe), _per_process(s, items), count=1, kind="cpu"))

    host_ram = 0.0
    if host_per_gpu:
        per_machine = max(s.gpus_per_machine, 1)
        host_items = [Item(i.name, i.category, i.bytes * per_machine, ALWAYS, i.source) for i in host_per_gpu]
        host = DevicePlan(f"host RAM (per machine, {per_machine} GPU(s))", _host_ram(recipe), host_items, kind="host")
        host_ram = host.total_gib
        devices.append(host)
        if host.capacity_gib is None:
            notes.append("set hardware.host_ram_gb to check the offloaded states against the machines' RAM.")
        if "nvme" in (s.offload_optimizer, s.offload_params):
            notes.append("NVMe offload: the offloaded states live on disk; host RAM then holds only pinned swap "
                         "buffers, which this plan does not model.")
    if s.objective != "sft" and s.precompute:
        from tuner.planner.preference import reference_pass_items

        training = devices[0]
        process = [i for i in items if i.source in ("measured", "nccl")]  # the process, not its tensors
        devices.append(DevicePlan(f"{training.name}, reference log-prob pass before training", training.capacity_gib,
                                  _per_process(s, reference_pass_items(s, gpu_items, process)), count=training.count,
                                  kind="pass"))
    if s.quant_bits and s.distributed in ("fsdp", "deepspeed") and (s.distributed == "fsdp" or s.zero == 3):
        notes.append("QLoRA sharded with ZeRO-3/FSDP stores 4-bit weights as the compute dtype "
                     "(bnb_4bit_quant_storage); tuner's loader sets it.")
    if s.quant_bits and f.is_moe:
        notes.append("bitsandbytes quantises only nn.Linear layers: the fused MoE experts of transformers v5 stay "
                     "unquantised, and k-bit preparation casts them to fp32.")
    if s.mixed and s.kind == "full" and s.distributed in ("none", "ddp") and s.weight_bytes == 2:
        notes.append("16-bit weights with 16-bit AdamW states (no fp32 master copy), as the Hugging Face Trainer "
                     "does for bf16 weights; load float32 weights for classic mixed precision.")

    verdict, missing = _verdict(devices)
    counts = f.param_counts
    trainable = counts.total if s.kind == "full" else f.lora_params(s.lora_r, s.lora_targets)
    return MemoryPlan(model=recipe.model.id, devices=devices, verdict=verdict, missing_gib=missing,
                      host_ram_gib=host_ram, notes=notes, params=counts.as_dict(), trainable_params=trainable,
                      micro_batch_size=recipe.memory.micro_batch_size, max_seq_length=s.seq)


def _per_process(s: _Setup, items: list[Item]) -> list[Item]:
    """Items of one process, for the whole CPU RAM of a CPU run with several gloo processes."""
    if s.on_gpu or s.world == 1:
        return items
    return [Item(i.name, i.category, i.bytes * s.world, i.phase, i.source) for i in items]


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
