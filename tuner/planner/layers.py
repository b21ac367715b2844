"""Activation terms per decoder layer kind: what autograd keeps of one layer, and what its backward adds.

A model's layers come in kinds (:mod:`tuner.catalog.layer_kinds`): a token mixer (attention, multi-head latent
attention, gated delta net) and an MLP (dense SwiGLU, or a mixture of experts).  Each function here returns bytes
for one layer of a kind at ``tokens`` tokens on one rank; the memory model adds them over the layers (or takes the
largest, for the one layer recomputed under gradient checkpointing).  Every term was derived by walking the ops of
the transformers 5.24 code path and what each saves for backward, and is checked against fake-tensor traces of tiny
instances of each class (docs/memory.md, "Layer kinds"; tests/test_layer_kinds.py).
"""
from __future__ import annotations

CHUNK = 64  # torch_chunk_gated_delta_rule's chunk_size, the default transformers' gated delta nets call it with


def residual_bytes(s) -> int:
    """Bytes of the residual stream: fp32 when fp32 weights run under autocast (the adds promote), else a."""
    return 4 if (s.mixed and s.weight_bytes == 4) else s.act_bytes


def attention_span(s) -> int:
    """Tokens each query can be masked against: the sequence, or the whole packed row with data.packing
    (DataCollatorWithFlattening concatenates the micro-batch's samples into one row)."""
    return s.batch * s.seq if s.packing else s.seq


def _split(value: int, tp: int) -> float:
    return value / tp if tp > 1 else value


def lora_linears(s, kind):
    """The layer's linear maps that carry a LoRA adapter (none for full fine-tuning, nor where ``method.train``
    leaves an image-text model's language model out)."""
    if s.kind == "full" or "language_model" not in s.train:
        return []
    return s.model.targeted_linears(kind, s.lora_targets, s.lora_parameters)


def layer_bytes(s, kind, tokens: int) -> float:
    """Everything autograd keeps of one layer of ``kind`` between its forward and its backward."""
    return tokens * (saved_bytes_per_token(s, kind) + span_bytes_per_token(s, kind)) + per_layer_bytes(s, kind)


def saved_bytes_per_token(s, kind) -> float:
    """Bytes kept per token for one layer, apart from the terms that grow with the attention span."""
    return _norm_bytes(s, kind) + _mixer_bytes(s, kind) + _mlp_bytes(s, kind) + _lora_bytes(s, kind)


def _norm_bytes(s, kind) -> float:
    """RMSNorm upcasts to fp32 (kept for pow/mul) and, when its weight trains, keeps the normalised input; Liger's
    RMSNorm saves its input and an fp32 reciprocal RMS per token."""
    a, full = s.act_bytes, s.kind == "full"
    if s.liger:
        return sum(residual_bytes(s) * width + 4 for width in kind.norms)
    return sum(4 * width + (a * width if full else 0) for width in kind.norms)


def _mixer_bytes(s, kind) -> float:
    if kind.mixer == "attention":
        return _attention_bytes(s, kind.dims)
    if kind.mixer == "mla":
        return _mla_bytes(s, kind.dims)
    if kind.mixer == "gated_delta_net":
        return _gated_delta_net_bytes(s, kind.dims)
    return 0.0


def _attention_bytes(s, d: dict) -> float:
    """q, k, v and the output (every kernel keeps them for backward), a log-sum-exp per head (fused kernels); full
    fine-tuning also keeps the inputs of q/k/v and of o_proj for the weight gradients.  One fused ``qkv_proj`` with as
    many key/value heads as query heads (Phi-3) hands sdpa v as a view of its output, which so stays whole (q and k
    are the rotary embedding's copies; eager's matmul keeps a copy of v instead) -- not added to a checkpointed LoRA
    layer, whose recompute moment is the fitted stand-in of :func:`_mlp_gradient_bytes` (fitted with Phi-3 too).
    Per-head or full-width q/k norms keep their fp32 upcasts; Qwen3-Next's output gate keeps the gate's sigmoid and
    the attention output it scales."""
    a, full, h = s.act_bytes, s.kind == "full", s.facts.hidden_size
    qd, kd = _split(d["q_width"], s.tp), _split(d["kv_width"], s.tp)
    total = a * (2 * qd + 2 * kd)
    whole_qkv = d.get("fused_qkv") and d["kv_heads"] == d["heads"] and not (s.eager or s.flash)
    if whole_qkv and (full or not s.checkpointing):
        total += a * (qd + kd)
    if full:
        total += a * h + a * qd
    if not s.eager:
        total += 4 * _split(d["heads"], s.tp)
    if d.get("qk_norm"):
        total += 4 * (qd + kd) + (a * (qd + kd) if full else 0)
    if d.get("output_gate"):
        total += 2 * a * qd
    if d.get("sinks") and s.eager:  # the row maxima of the sink-extended logits (int64 indices)
        total += 8 * _split(d["heads"], s.tp)
    return total


def _mla_bytes(s, d: dict) -> float:
    """Multi-head latent attention (DeepSeek-V2/V3, transformers' DeepseekV3Attention): the low-rank latents' RMSNorm
    upcasts (their fp32 input and reciprocal RMS) and, when they train, the normed latents and the inputs of q_b and
    kv_b; attention over H heads keeps q and k of (nope + rope) width and v as the view of kv_b's output it is
    ((nope + v) wide); o_proj's input is a copy when it trains."""
    a, full, h = s.act_bytes, s.kind == "full", s.facts.hidden_size
    heads = _split(d["heads"], s.tp)
    qk, kv_b, vo = heads * d["head_dim"], heads * (d["nope_dim"] + d["v_dim"]), heads * d["v_dim"]
    q_rank, kv_rank, rope = d["q_rank"], d["kv_rank"], d["rope_dim"]
    total = (4 * q_rank + 4 if q_rank else 0) + 4 * (kv_rank + rope) + 4
    if full:
        total += a * h + 2 * a * q_rank + 2 * a * kv_rank + a * vo
    if _mla_sdpa_math(s, d):
        return total + a * (2 * qk + vo) + 4 * heads * attention_span(s)
    total += a * (2 * qk + kv_b)
    if not s.eager:
        total += 4 * heads
    return total


def _mla_sdpa_math(s, d: dict) -> bool:
    """Whether sdpa runs latent attention through torch's math fallback: on the CPU, whose fused kernel needs one head
    width for q, k and v (DeepSeek's v is narrower than its q/k); the math path keeps the scaled q, k, a contiguous v
    and the fp32 probabilities (traced).  CUDA's memory-efficient kernel takes a narrower v."""
    return not (s.eager or s.flash or s.on_gpu) and d["head_dim"] != d["v_dim"]


def _gated_delta_net_bytes(s, d: dict) -> float:
    """Qwen3-Next / Qwen3.5's gated delta net through transformers' torch path (``torch_chunk_gated_delta_rule``,
    what runs without flash-linear-attention), walked op by op (docs/memory.md, "Gated delta net"): the causal
    conv1d's input and SiLU input (a x its width, the q/k/v channels), the decay and beta gates; in fp32 over value
    heads (q and k repeated to them): 11 key-width and 8 value-width tensors per head (l2-normalised q and k,
    k x beta, the UT solve's operands and results, the gated RMSNorm), 5 chunk x chunk matrices per head and
    token (the pairwise decay, the UT system, the intra-chunk attention), and the k_dim x v_dim recurrent state each
    chunk of 64 tokens saves.  Full fine-tuning also keeps the in-projections' input, the norm's normalised output
    and out_proj's input."""
    a, full, h = s.act_bytes, s.kind == "full", s.facts.hidden_size
    vh = _split(d["v_heads"], s.tp)
    dk, dv = d["k_dim"], d["v_dim"]
    conv = _split(d["conv_width"], s.tp)
    total = 2 * a * conv + 3 * a * vh
    total += 4 * vh * (11 * dk + 8 * dv + 5 * CHUNK + 7) + 4 * vh * dk * dv / CHUNK
    if full:
        total += a * h + 4 * vh * dv + a * vh * dv
    return total


def _mlp_bytes(s, kind) -> float:
    d = kind.dims
    if kind.mlp == "dense":
        return _swiglu_bytes(s, _split(d["intermediate"], s.tp))
    if kind.mlp == "moe":
        return _moe_bytes(s, kind)
    return 0.0


def _swiglu_bytes(s, width: float) -> float:
    """Gate output (SiLU input), SiLU output and up output (the product's operands); Liger's fused SiLU-mul keeps the
    gate and up outputs.  Full fine-tuning also keeps the MLP input and the down_proj input."""
    a, h = s.act_bytes, s.facts.hidden_size
    return (2 if s.liger else 3) * a * width + (a * h + a * width if s.kind == "full" else 0)


def _moe_bytes(s, kind) -> float:
    """A mixture of experts per token, as transformers 5.24 runs it (docs/memory.md, "Mixture of experts").

    grouped (``grouped_mm_experts_forward``), per token and each of its k experts: the gate_up output (the SiLU's
    input), the SiLU's output and down's output (the routing weight's operands), the routing weight and the sort's
    int64 indices; trained or adapted experts also keep grouped_mm's inputs (the gathered hidden state and the
    product).  gpt-oss's clamped gate keeps three more expert-width tensors.  Llama 4 runs every token through every
    expert, scaled by its router score: the same tensors E times.  The router keeps its fp32 softmax and the top-k
    indices, and its input when it trains; shared experts are a dense SwiGLU of their width.
    """
    d = kind.dims
    a, h, k, experts = s.act_bytes, s.facts.hidden_size, d["top_k"], d["experts"]
    width = _split(d["expert_width"], s.tp)
    trained = s.kind == "full" or any(not lin.is_nn_linear and ".experts." in f".{lin.name}"
                                      for lin in lora_linears(s, kind))
    router_trains = s.kind == "full" or any(lin.name.startswith(f"{d['mlp_path']}.{d['router_path']}")
                                            for lin in lora_linears(s, kind))
    per_expert = a * (2 * width + width + h) + (a * (h + width) if trained else 0)
    if d.get("clamped_gate"):
        per_expert += 3 * a * width
    if d["dispatch"] == "all_experts":
        total = experts * (per_expert + a * h + a)
    else:
        total = k * (per_expert + a + 24)
    total += 4 * experts + 8 * k + (a * h if router_trains else 0)
    if d.get("shared_width"):
        total += _swiglu_bytes(s, _split(d["shared_width"], s.tp)) - (a * h if s.kind == "full" else 0)
    if d.get("shared_gate"):
        total += 2 * a
    return total


def per_layer_bytes(s, kind) -> float:
    """What one layer keeps whatever the tokens: PEFT's LoRA on fused experts (``target_parameters``) adds B x A to
    each adapted expert tensor on every forward (``_LoraFactorsProxy``: one baddbmm in the tensor's dtype, 16 bits once
    a DeepSpeed bf16 engine has cast it), and the merged copy is the weight grouped_mm saves for the backward: a whole
    expert tensor per adapted parameter; and autocast's copies of the adapters' weights."""
    if s.kind == "full":
        return 0.0
    if kind.mlp != "moe":
        return lora_weight_casts_bytes(s, kind)
    weight = s.held_weight_bytes if s.quant_bits is None else 4  # k-bit preparation leaves experts in fp32
    merged = sum(lin.weight_params / s.tp * weight for lin in lora_linears(s, kind)
                 if not lin.is_nn_linear and ".experts." in f".{lin.name}")
    return merged + lora_weight_casts_bytes(s, kind)


# Linear maps that read one and the same input tensor (transformers' names): their LoRA branches share it too
# unless each makes its own copy (a cast or a dropout)
SHARED_INPUTS = (frozenset({"q_proj", "k_proj", "v_proj"}), frozenset({"gate_proj", "up_proj"}),
                 frozenset({"q_a_proj", "kv_a_proj_with_mqa"}), frozenset({"in_proj_qkvz", "in_proj_ba"}))


def _lora_bytes(s, kind) -> float:
    """LoRA branches, per targeted nn.Linear (PEFT's ``Linear.forward``: ``lora_B(lora_A(dropout(x)))``): lora_B keeps
    its r-wide input in the dtype the adapter's matmul runs in (autocast's, else the fp32 adapters'), and lora_A its
    input.  With a dropout, that input is the branch's own dropped-out copy beside its mask: in x (compute + 3), the
    term fitted to the fake-tensor traces and held to the H200 measurements (tests/test_planner_simulation.py,
    tests/test_planner_measured.py).  Without one (traced per tensor on the CPU: docs/memory.md, "LoRA branches"),
    lora_A keeps a copy of its own only when the branch casts x (autocast, or 16-bit activations into the fp32
    adapters): in x compute; else x itself, kept once for the maps that read the same x (q/k/v, gate/up).  GPU
    recipes keep the fitted term, in x (compute + 2) without a dropout: the H200 runs exceed the CPU traces there."""
    return _lora_branch_bytes(s, [lin for lin in lora_linears(s, kind) if lin.is_nn_linear])


def _lora_branch_bytes(s, targets) -> float:
    compute = 2 if s.mixed else 4
    if s.lora_dropout > 0 or s.on_gpu:
        inputs = sum(lin.in_features * (compute + 2 + (1 if s.lora_dropout > 0 else 0)) for lin in targets)
    elif s.mixed or s.act_bytes != 4:
        inputs = sum(lin.in_features * compute for lin in targets)
    else:
        inputs = sum(in_features * compute for in_features in _distinct_inputs(targets).values())
    return inputs + len(targets) * s.lora_r * compute


def _distinct_inputs(targets) -> dict[str, int]:
    """The distinct input tensors of these linear maps, keyed by the first map that reads each: its width."""
    inputs: dict[str, int] = {}
    for lin in targets:
        parent, _, leaf = lin.name.rpartition(".")
        group = next((sorted(names)[0] for names in SHARED_INPUTS if leaf in names), leaf)
        inputs.setdefault(f"{parent}.{group}", lin.in_features)
    return inputs


def lora_weight_casts_bytes(s, kind) -> float:
    """Autocast's cached 16-bit copies of the fp32 adapters' weights, kept for their backward: r x (in + out) x 2
    per adapted nn.Linear."""
    if not s.mixed:
        return 0.0
    return sum(2 * s.lora_r * (lin.in_features + lin.out_features) for lin in lora_linears(s, kind)
               if lin.is_nn_linear)


def span_bytes_per_token(s, kind) -> float:
    """Per token, the terms that grow with the attention span (the sequence, or the packed row).

    eager keeps the fp32 softmax (and its 16-bit copy) of every head: (4 + a) x heads x span (attention sinks add
    one column), and Gemma-2's soft-capped scores, softcap x tanh(scores / softcap), keep tanh's output (a) too
    (flash-attention caps inside its kernel); sdpa receives the boolean causal/padding mask (with packing: the block-diagonal mask of the packed
    row, which transformers always materialises) and converts it to an additive mask of the compute dtype in every
    layer (kept for backward): a x span, also for a sliding window, whose mask is the same size.  flash-attention
    keeps neither, nor does a split sequence, nor a gated delta net (no mask, no scores).
    """
    if kind.mixer not in ("attention", "mla"):
        return 0.0
    a, span = s.act_bytes, attention_span(s)
    if s.eager:
        heads = _split(kind.dims["heads"], s.tp)
        softcapped = heads * span * a if s.facts.attn_logit_softcapping else 0.0
        return heads * (span + (1 if kind.dims.get("sinks") else 0)) * (4 + (a if a != 4 else 0)) + softcapped
    if s.flash or s.seq_shards > 1:
        return 0.0
    return a * span


def checkpointed_masks_bytes(s) -> float:
    """eager attention's additive masks, built once per attention type (full, sliding, chunked) in the embeddings'
    dtype and passed to every layer: under gradient checkpointing each checkpointed layer keeps them as inputs until
    its recompute, so they live through the backward, b x s x span each (one packed row with data.packing).  sdpa
    with no padding gets no mask at all (transformers lets the kernel's is_causal do it), flash-attention none."""
    if not (s.checkpointing and s.eager):
        return 0.0
    types = {kind.attention_type for kind in kinds(s) if kind.mixer in ("attention", "mla")}
    return len(types) * s.batch * s.seq * attention_span(s) * residual_bytes(s)


def mlp_width(s, kind) -> float:
    """The widest intermediate one token passes through in the layer's MLP (all k experts' for a MoE, every expert's
    where every token runs through all of them: Llama 4)."""
    d = kind.dims
    if kind.mlp == "moe":
        routed = d["experts"] if d["dispatch"] == "all_experts" else d["top_k"]
        return _split(d["expert_width"], s.tp) * routed + _split(d.get("shared_width", 0), s.tp)
    if kind.mlp == "dense":
        return _split(d["intermediate"], s.tp)
    return 0.0


def backward_bytes(s, kind, tokens: int) -> float:
    """The gradients of one layer's intermediates while its backward runs, beyond what the layer keeps, at the fullest
    of its moments, in the order the backward reaches them: a norm on the MLP's output (Gemma 2/3, OLMo 2, GLM 4),
    with four fp32 hidden-wide temporaries (RMSNorm's backward; Liger's kernel makes none) beside everything saved;
    the MLP's (:func:`_mlp_gradient_bytes`) while it is still saved; then, eager, the span x span probabilities' and
    scores' gradients, once the MLP's saved tensors are freed (its backward ran first); for a gated delta net, its
    chunk matrices' gradients.  PEFT's fp32 branch in a 16-bit model holds fp32 gradients of the widest adapted
    input."""
    a = s.act_bytes
    norm = 4 * 4 * s.facts.hidden_size if kind.dims.get("norm_after_mlp") and not s.liger else 0.0
    mlp = _mlp_gradient_bytes(s, kind)
    targets = [lin for lin in lora_linears(s, kind) if lin.is_nn_linear]
    if targets and a == 2:
        mlp += 2 * 4 * max(lin.in_features for lin in targets)
    mixer = 0.0
    if (s.eager and kind.mixer in ("attention", "mla")) or (kind.mixer == "mla" and _mla_sdpa_math(s, kind.dims)):
        mixer = (4 + a) * _split(kind.dims["heads"], s.tp) * attention_span(s)
    if kind.mixer == "gated_delta_net":
        mixer = 4 * _split(kind.dims["v_heads"], s.tp) * (4 * CHUNK + 2 * kind.dims["k_dim"])
    return tokens * max(norm, mlp, mixer - _after_mixer_bytes(s, kind)) + _merged_expert_gradient(s, kind)


def _mlp_gradient_bytes(s, kind) -> float:
    """Per token, the MLP's gradients beside what it saved, at its backward's fullest moment.  Fully fine-tuned dense
    gated MLP, ``down(act(gate(x)) * up(x))``: down's backward makes the product's gradient and frees its saved input
    (the product, kept for down's weight gradient); the product's backward then makes the gradients of both of its
    operands while its own is alive: three intermediate-wide gradients less the input freed, 2 x a per intermediate
    element (traced per tensor on diagnostic shapes, docs/memory.md, "The layer's backward").  Otherwise 4 x a:
    LoRA's checkpointed step peaks as the layer's recompute finishes with PEFT's dropout copies, which this term
    stands in for (fitted with them); MoE experts and Liger's fused SiLU-mul run other kernels."""
    dense_full = kind.mlp == "dense" and s.kind == "full" and not s.liger
    return (2 if dense_full else 4) * s.act_bytes * mlp_width(s, kind)


def _after_mixer_bytes(s, kind) -> float:
    """What the layer keeps per token past its token mixer, freed by the time the mixer's backward runs: the MLP's
    tensors, the LoRA branches outside the mixer's module, the norms after the first."""
    a, full = s.act_bytes, s.kind == "full"
    mixer_module = kind.linears[0].name.split(".")[0] if kind.linears else ""
    outside = [lin for lin in lora_linears(s, kind) if lin.is_nn_linear and not lin.name.startswith(mixer_module + ".")]
    norms = sum(4 * width + (a * width if full else 0) for width in kind.norms[1:])
    return _mlp_bytes(s, kind) + _lora_branch_bytes(s, outside) + norms


def _merged_expert_gradient(s, kind) -> float:
    """LoRA on fused experts: grouped_mm's backward makes the gradient of the merged expert tensor (W + B x A) whole
    before PEFT's factors take their share of it, one adapted tensor at a time."""
    if s.kind == "full" or kind.mlp != "moe":
        return 0.0
    weight = s.weight_bytes if s.quant_bits is None else 4
    sizes = [lin.weight_params / s.tp * weight for lin in lora_linears(s, kind)
             if not lin.is_nn_linear and ".experts." in f".{lin.name}"]
    return max(sizes, default=0.0)


def forward_transient_bytes(s, kind, tokens: int) -> float:
    """The largest transient of one layer's forward without gradients: the MLP's gate, up and product -- with one
    fused gate_up_proj (Phi-3) its whole output stays alive through the product, one more -- (or eager attention's
    fp32 scores and their softmax)."""
    per_token = (4 if kind.dims.get("fused_gate_up") else 3) * s.act_bytes * mlp_width(s, kind)
    if s.eager and kind.mixer in ("attention", "mla"):
        per_token = max(per_token, _split(kind.dims["heads"], s.tp) * s.seq * (4 + s.act_bytes))
    return tokens * per_token


def kinds(s):
    return s.model.layer_kinds


def all_layers_bytes(s, tokens: int) -> float:
    """Every layer's saved activations (no gradient checkpointing)."""
    return sum(kind.count * layer_bytes(s, kind, tokens) for kind in kinds(s))


def largest(function, s, tokens: int) -> float:
    """The largest of ``function(s, kind, tokens)`` over the model's layer kinds."""
    return max(function(s, kind, tokens) for kind in kinds(s))


