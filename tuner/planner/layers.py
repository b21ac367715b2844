"""Activation terms per decoder layer kind: what autograd keeps of one layer, and what its backward adds.

A model's layers come in kinds (:mod:`tuner.catalog.layer_kinds`): a token mixer (attention, multi-head latent
attention, gated delta net) and an MLP (dense SwiGLU, or a mixture of experts).  Each function here returns bytes
for one layer of a kind at ``tokens`` tokens on one rank; the memory model adds them over the layers (or takes the
largest, for the one layer recomputed under gradient checkpointing).  Every term was derived by walking the ops of
the transformers 5.24 code path and what each saves for backward, and is checked against fake-tensor traces of tiny
instances of each class (docs/memory.md, "Layer kinds"; tests/test_layer_kinds.py).
"""
from __future__ import annotations

import math

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
    """The layer's linear maps that carry a LoRA adapter (none for full fine-tuning)."""
    if s.kind == "full":
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
    fine-tuning also keeps the inputs of q/k/v and of o_proj for the weight gradients.  Per-head or full-width q/k
    norms keep their fp32 upcasts; Qwen3-Next's output gate keeps the gate's sigmoid and the attention output it
    scales."""
    a, full, h = s.act_bytes, s.kind == "full", s.facts.hidden_size
    qd, kd = _split(d["q_width"], s.tp), _split(d["kv_width"], s.tp)
    total = a * (2 * qd + 2 * kd)
    if full:
        total += a * h + a * qd
    if not s.eager:
        total += 4 * _split(d["heads"], s.tp)
    if d.get("qk_norm"):
        total += 4 * (qd + kd) + (a * (qd + kd) if full else 0)
    if d.get("output_gate"):
        total += 2 * a * qd
    return total


def _mla_bytes(s, d: dict) -> float:
    """Multi-head latent attention (DeepSeek-V2/V3, transformers' DeepseekV3Attention): the low-rank q and kv
    projections' normed latents (fp32 upcasts, and as the inputs of q_b/kv_b when those train), then attention over
    H heads of (nope + rope) query/key width and v_head_dim values; the rope halves are split, rotated and joined
    again (kept for the joins' backward)."""
    a, full, h = s.act_bytes, s.kind == "full", s.facts.hidden_size
    heads = _split(d["heads"], s.tp)
    qk, v = heads * d["head_dim"], heads * d["v_dim"]
    q_rank, kv_rank, rope = d["q_rank"], d["kv_rank"], d["rope_dim"]
    total = a * (2 * qk + 2 * v)  # q, k, v and the output of attention
    total += 4 * (q_rank + kv_rank)  # the latents' RMSNorm upcasts
    total += a * (2 * heads * rope + rope)  # rotated q and k halves, and the shared k_pe before expansion
    if full:
        total += a * h + a * (q_rank + kv_rank) * 2 + a * v  # inputs of q_a/kv_a, the normed latents, o_proj's input
    if not s.eager:
        total += 4 * heads
    return total


def _gated_delta_net_bytes(s, d: dict) -> float:
    """Qwen3-Next / Qwen3.5's gated delta net through transformers' torch path (``torch_chunk_gated_delta_rule``,
    what runs without flash-linear-attention): the projections' outputs, the causal conv1d and its SiLU, and the
    chunked delta rule in fp32 over chunks of 64 tokens, whose intra-chunk matrices (64 x 64 per head) and the
    recurrent state each chunk saves (k_dim x v_dim per head) dominate; the gated RMSNorm on the way out."""
    a, full, h = s.act_bytes, s.kind == "full", s.facts.hidden_size
    kh, vh = _split(d["k_heads"], s.tp), _split(d["v_heads"], s.tp)
    dk, dv = d["k_dim"], d["v_dim"]
    conv = _split(d["conv_width"], s.tp)
    key, value = kh * dk, vh * dv
    total = a * (conv + conv + 2 * value)  # conv input and SiLU output, the z gate and the core's output
    total += 4 * vh * (dk + dk + dv + dv)  # fp32 q, k (repeated to the value heads), v and k/v x beta
    total += 4 * vh * (3 * CHUNK)  # pairwise decay, the UT system and the intra-chunk attention, per token
    total += 4 * vh * dk * dv / CHUNK  # the recurrent state every chunk saves, shared by its 64 tokens
    total += 4 * value * 2  # the gated norm's fp32 input and gate
    if full:
        total += a * h + a * value
    return total


def _mlp_bytes(s, kind) -> float:
    d = kind.dims
    if kind.mlp == "dense":
        return _swiglu_bytes(s, _split(d["intermediate"], s.tp))
    if kind.mlp == "moe":
        return _moe_bytes(s, d)
    return 0.0


def _swiglu_bytes(s, width: float) -> float:
    """Gate output (SiLU input), SiLU output and up output (the product's operands); Liger's fused SiLU-mul keeps the
    gate and up outputs.  Full fine-tuning also keeps the MLP input and the down_proj input."""
    a, h = s.act_bytes, s.facts.hidden_size
    return (2 if s.liger else 3) * a * width + (a * h + a * width if s.kind == "full" else 0)


def _moe_bytes(s, d: dict) -> float:
    """transformers 5.24's grouped_mm experts (``grouped_mm_experts_forward``), per token routed to k experts: the
    gathered hidden states, the gate_up output, its SiLU and the product (down's input), down's output before the
    routing weights scale it, and the sort's int64 indices; the router's logits and fp32 softmax; shared experts
    as a dense SwiGLU of their width."""
    a, h, k = s.act_bytes, s.facts.hidden_size, d["top_k"]
    width = _split(d["expert_width"], s.tp)
    per_slot = a * (h + 2 * width + width + width + h) + 8 * 3 + a
    total = k * per_slot + d["experts"] * (a + 4) + 8 * k
    if d.get("shared_width"):
        total += _swiglu_bytes(s, _split(d["shared_width"], s.tp))
    if d.get("shared_gate"):
        total += 2 * a
    return total


def per_layer_bytes(s, kind) -> float:
    """What one layer keeps whatever the tokens: PEFT's LoRA on fused experts (``target_parameters``) adds B x A to
    each adapted expert tensor on every forward (``_LoraFactorsProxy``: one baddbmm in the tensor's dtype), and the
    merged copy is the weight grouped_mm saves for the backward: a whole expert tensor per adapted parameter."""
    if s.kind == "full" or kind.mlp != "moe":
        return 0.0
    weight = s.weight_bytes if s.quant_bits is None else 4  # k-bit preparation leaves experts in fp32
    return sum(lin.weight_params / s.tp * weight for lin in lora_linears(s, kind) if not lin.is_nn_linear
               and ".experts." in f".{lin.name}")


def _lora_bytes(s, kind) -> float:
    """LoRA branches, per targeted nn.Linear: the adapter's input in its compute dtype and its dropped-out copy (with
    the mask); fitted to fake-tensor traces: in x (a + 2), plus in bytes with dropout."""
    targets = [lin for lin in lora_linears(s, kind) if lin.is_nn_linear]
    lora_act = 2 if s.mixed else 4
    return sum(lin.in_features * (lora_act + 2 + (1 if s.lora_dropout > 0 else 0)) + s.lora_r * lora_act
               for lin in targets)


def span_bytes_per_token(s, kind) -> float:
    """Per token, the terms that grow with the attention span (the sequence, or the packed row).

    eager keeps the fp32 softmax (and its 16-bit copy) of every head: (4 + a) x heads x span (attention sinks add
    one column); sdpa receives the boolean causal/padding mask (with packing: the block-diagonal mask of the packed
    row, which transformers always materialises) and converts it to an additive mask of the compute dtype in every
    layer (kept for backward): a x span, also for a sliding window, whose mask is the same size.  flash-attention
    keeps neither, nor does a split sequence, nor a gated delta net (no mask, no scores).
    """
    if kind.mixer not in ("attention", "mla"):
        return 0.0
    a, span = s.act_bytes, attention_span(s)
    if s.eager:
        heads = _split(kind.dims["heads"], s.tp)
        return heads * (span + (1 if kind.dims.get("sinks") else 0)) * (4 + (a if a != 4 else 0))
    if s.flash or s.seq_shards > 1:
        return 0.0
    return a * span


def mlp_width(s, kind) -> float:
    """The widest intermediate one token passes through in the layer's MLP (all k experts' for a MoE)."""
    d = kind.dims
    if kind.mlp == "moe":
        return _split(d["expert_width"], s.tp) * d["top_k"] + _split(d.get("shared_width", 0), s.tp)
    if kind.mlp == "dense":
        return _split(d["intermediate"], s.tp)
    return 0.0


def backward_bytes(s, kind, tokens: int) -> float:
    """The gradients of one layer's intermediates while its backward runs: the MLP's (4 x a per intermediate
    element) or, eager, the span x span probabilities' and scores'; the MLP's are freed before the attention's
    backward starts.  PEFT's fp32 branch in a 16-bit model holds fp32 gradients of the widest adapted input."""
    a = s.act_bytes
    mlp = 4 * a * mlp_width(s, kind)
    targets = [lin for lin in lora_linears(s, kind) if lin.is_nn_linear]
    if targets and a == 2:
        mlp += 2 * 4 * max(lin.in_features for lin in targets)
    scores = 0.0
    if s.eager and kind.mixer in ("attention", "mla"):
        scores = 6 * _split(kind.dims["heads"], s.tp) * attention_span(s)
    if kind.mixer == "gated_delta_net":
        scores = 4 * _split(kind.dims["v_heads"], s.tp) * (4 * CHUNK + 2 * kind.dims["k_dim"])
    return tokens * max(mlp, scores)


def forward_transient_bytes(s, kind, tokens: int) -> float:
    """The largest transient of one layer's forward without gradients: the MLP's gate, up and product (or eager
    attention's fp32 scores and their softmax)."""
    per_token = 3 * s.act_bytes * mlp_width(s, kind)
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


def ceil_chunks(tokens: int) -> int:
    return math.ceil(tokens / CHUNK) * CHUNK
