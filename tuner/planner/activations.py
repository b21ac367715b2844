"""Activations and communication: what the forward saves for the backward, the loss and logits buffers, one
layer's recomputation, evaluation batches and the collectives' buffers."""
from __future__ import annotations

import math

from tuner.planner.items import FORWARD_BACKWARD, LAYER_BACKWARD, EVAL, BACKWARD, Item
from tuner.planner.layers import (_split, all_layers_bytes, attention_span, backward_bytes,
                                  checkpointed_masks_bytes, kinds, largest, layer_bytes, lora_linears,
                                  lora_weight_casts_bytes, mlp_width, residual_bytes)
from tuner.planner.model_states import layer_params
from tuner.planner.preference import head_transient_bytes
from tuner.planner.rank_setup import Setup


def softcapped_logits_items(s: Setup, tokens: int) -> list[Item]:
    """Gemma-2 caps its logits, softcap x tanh(logits / softcap), before the loss: tanh keeps its T x V output (the
    logits' dtype) for backward, beside the loss buffers."""
    if not s.facts.final_logit_softcapping:
        return []
    return [Item("logit soft-capping: tanh's output kept for backward (s x b x V)", "logits_loss",
                 tokens * s.facts.vocab_size * s.act_bytes, FORWARD_BACKWARD, source="softcap")]


def _next_power_of_two(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _loss_items(s: Setup, tokens: int, full: bool) -> list[Item]:
    """The output head and the cross-entropy at the end of the forward (and their gradients)."""
    f = s.facts
    h, vocab = f.hidden_size, f.vocab_size
    rb = residual_bytes(s)
    rotary = s.seq * f.head_dim * 2 * s.act_bytes
    final_norm = tokens * h * (4 + (s.act_bytes if full else 0))
    if s.objective == "reward":
        from tuner.planner.reward import loss_items as reward_loss_items

        return [Item("final norm, score-head input, rotary tables", "activations",
                     final_norm + tokens * h * s.act_bytes + rotary, FORWARD_BACKWARD, source="korthikanti"),
                *reward_loss_items(s)]
    if s.objective != "sft":  # TRL's fused log-prob head replaces the logits and the cross-entropy
        from tuner.planner.grpo import loss_items as grpo_loss_items
        from tuner.planner.preference import loss_items

        loss_items = grpo_loss_items if s.rollout else loss_items

        return [Item("final norm, output-head input, rotary tables", "activations",
                     final_norm + tokens * h * s.act_bytes + rotary, FORWARD_BACKWARD, source="korthikanti"),
                *loss_items(s)]
    if s.teacher is not None:  # GKD: the student's and the teacher's full logits and the divergence
        from tuner.planner.distill import loss_items

        return [Item("final norm, output-head input, rotary tables", "activations",
                     final_norm + tokens * h * s.act_bytes + rotary, FORWARD_BACKWARD, source="korthikanti"),
                *loss_items(s, tokens)]
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


def activation_items(s: Setup) -> tuple[list[Item], list[Item], list[str]]:
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


def _layer_source(s: Setup) -> str:
    """korthikanti for a dense attention model; the layer-kind terms' key when any layer is MoE, MLA or linear."""
    kinds = s.model.layer_kinds
    if any(kind.mlp == "moe" or kind.mixer != "attention" for kind in kinds):
        return "layer-kinds"
    return "korthikanti"


def _finished_layer_gradients(s: Setup, kept_per_layer: float) -> list[Item]:
    """Full fine-tuning, gradients freed between steps: as the backward walks down the layers, each finished layer
    frees what it kept (``kept_per_layer``: its saved activations, or its checkpointed input) and leaves its
    gradients.  At layer k, (L-1-k) layers' gradients and (k+1) layers' kept tensors are live; the larger end is
    k = 0 where a layer's gradients outweigh what it kept: (L-1) x (gradients - kept) more than the plan's
    all-kept moment."""
    f = s.facts
    extra = (f.num_layers - 1) * (layer_params(f) * s.weight_bytes - kept_per_layer)
    if extra <= 0:
        return []
    return [Item("gradients of the finished layers, beyond the activations they freed", "gradients", extra,
                 LAYER_BACKWARD, source="torch-autograd")]


def _sequence_label(s: Setup) -> str:
    """', sequence 1/4 by cp' where a sequence is split across ranks; '' otherwise."""
    if s.seq_shards == 1:
        return ""
    return f", sequence 1/{s.seq_shards} by {'cp' if s.distributed == 'fsdp' else 'sp'}"


def _activation_label(s: Setup) -> str:
    """How one rank's share of the saved activations is split: the attention core and the MLP's intermediates by tp
    (the layer inputs, norms and residual stay whole: neither backend shards them along the sequence), every token
    by cp or sp."""
    parts = [f"attention and MLP tp 1/{s.tp}"] if s.tp > 1 else []
    if s.seq_shards > 1:
        parts.append(_sequence_label(s)[2:])
    return ", ".join(parts)


def _communication_items(s: Setup, tokens: int) -> list[Item]:
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


def eval_items(s: Setup) -> list[Item]:
    """An evaluation batch (per_device_eval_batch_size = the micro-batch) of the Trainer's ``prediction_step``: eval
    mode, no gradients, so nothing is saved for backward.  Live beside the weights and optimizer states, the larger
    of two moments of the forward (traced with :func:`tuner.loading.simulate.simulate`, ``evaluation=True``):

    - **a layer** (the last): the hidden states the forward holds (the embeddings' output, the layer's input, its
      normalised input), the attention masks and rotary tables the model's forward built once for every layer, and
      the layer's own transient (:func:`_eval_layer_bytes`);
    - **the loss**, after the layers: the plain loss holds the final norm's output only (the base model has returned
      and its locals are freed), the logits built whole (a), their fp32 upcast (4, none when they are fp32 already)
      and the fp32 log-softmax (4) -- soft-capped logits add nothing: no gradients, so ``logits / cap``, ``tanh``
      and ``* cap`` each free the one before as ``logits`` is rebound -- unless a fused or chunked loss runs.

    Under autocast the fp32 weights that require grad (LoRA's adapters, full fine-tuning's weights) keep their cached
    16-bit copies until the forward ends (:func:`autocast_adapter_copies`, and the weights' own item in
    :mod:`tuner.planner.model_states`), counted whole in both moments: over by the copies the last layer and the
    output head make after the layer moment.  Traced per tensor on Phi-3, Gemma-2, Llama and tied Qwen2 shapes
    other than the benchmark's (docs/memory.md, "What a recipe sets, and the evaluation phase").
    """

    f = s.facts
    tokens = s.batch * s.seq
    if s.rollout:  # grpo evaluates by generating
        from tuner.planner.grpo import eval_items

        return eval_items(s)
    rb = residual_bytes(s)
    copies = autocast_adapter_copies(s)
    # the embeddings' output (the model's forward keeps inputs_embeds), the layer's input (the decoder loop's
    # hidden_states: the embeddings' output itself in a one-layer model) and its normalised input
    held = 3 if f.num_layers > 1 else 2
    hidden = Item("evaluation: hidden states (the embedding output, the layer's input, its normalised input)",
                  "activations", held * tokens * f.hidden_size * rb, EVAL, source="korthikanti")
    if s.objective == "reward":
        from tuner.planner.reward import eval_loss_items

        loss = [hidden, *eval_loss_items(s)]
    elif s.objective != "sft":  # TRL's fused log-prob head, forward only
        loss = [hidden, Item("evaluation: the fused log-prob head's forward tiles", "logits_loss",
                             head_transient_bytes(s, tokens, backward=False), EVAL, source="trl-fused-head")]
    elif s.teacher is not None:  # GKD's compute_loss without gradients
        from tuner.planner.distill import eval_loss_items

        loss = [Item("evaluation: the final norm's output (the layers have returned)", "activations",
                     tokens * f.hidden_size * rb, EVAL, source="korthikanti"), *eval_loss_items(s, tokens)]
    elif s.liger or s.chunked_loss:
        rows = min(tokens, _next_power_of_two(tokens / math.ceil(f.vocab_size / f.hidden_size)))
        loss = [hidden, Item("evaluation: one logits chunk of the fused loss", "logits_loss", rows * f.vocab_size * 4,
                             EVAL, source="liger" if s.liger else "torch-lce")]
    else:
        upcast = 4 if s.act_bytes != 4 else 0
        loss = [Item("evaluation: the final norm's output (the layers have returned)", "activations",
                     tokens * f.hidden_size * rb, EVAL, source="korthikanti"),
                Item("evaluation: logits, fp32 upcast and log-softmax (no gradients)", "logits_loss",
                     tokens * f.vocab_size * (s.act_bytes + upcast + 4), EVAL, source="hf-loss")]
    layer = [hidden]
    built = _eval_masks_bytes(s) + attention_span(s) * f.head_dim * 2 * rb  # rotary cos and sin: embeddings' dtype
    layer.append(Item("evaluation: attention masks and rotary tables, built once for every layer", "activations",
                      built, EVAL, source="korthikanti"))
    layer.append(Item("evaluation: one layer's forward transient (no gradients)", "activations",
                      largest(_eval_layer_bytes, s, tokens), EVAL, source="korthikanti"))
    moment = layer if sum(i.bytes for i in layer) > sum(i.bytes for i in loss) else loss
    return moment + copies


def autocast_adapter_copies(s: Setup) -> list[Item]:
    """autocast caches the 16-bit cast of an fp32 leaf that requires grad (``cached_cast`` in torch's
    autocast_mode.cpp: no check of the grad mode) until the autocast region exits: an evaluation forward keeps every
    layer's adapter copies, r x (in + out) x 2 per adapted nn.Linear, as the training step does for its backward."""
    casts = sum(kind.count * lora_weight_casts_bytes(s, kind) for kind in kinds(s))
    if not casts:
        return []
    return [Item("evaluation: autocast's cached 16-bit copies of every layer's adapters", "lora_adapter", casts, EVAL,
                 source="autocast")]


def _eval_masks_bytes(s: Setup) -> float:
    """The attention masks the model's forward builds once (transformers' masking_utils) and passes to every layer,
    one per attention type (full, sliding, chunked): eager's additive masks, b x s x span in the embeddings' dtype;
    sdpa's boolean mask, b x s x span bytes, made for a batch with padding (as the training step plans it; a trace
    always gets it: under fake tensors ``find_packed_sequence_indices`` cannot rule packing out); flash-attention and
    a split sequence none."""
    if s.flash or s.seq_shards > 1:
        return 0.0
    types = {kind.attention_type for kind in kinds(s) if kind.mixer in ("attention", "mla")}
    return len(types) * s.batch * s.seq * attention_span(s) * (residual_bytes(s) if s.eager else 1)


def _eval_layer_bytes(s: Setup, kind, tokens: int) -> float:
    """One layer's forward transient without gradients, beyond the hidden states counted with it: the larger of

    - its MLP (tuner.planner.layers: SwiGLU's gate, up and product, a fused gate_up_proj's whole output alive
      through the product), beside the attention's residual sum (the decoder layer's ``residual``, 1 x h) and, with
      eager attention, the layer's attention probabilities: ``hidden_states, _ = self.self_attn(...)`` keeps the
      returned weights in ``_`` until the layer returns, b x heads x s x span in the query's dtype (the residual
      bytes: rotary's cos and sin, in the embeddings' dtype, promote q and k to fp32 when fp32 weights run under
      autocast).  LoRA on gate/up adds PEFT's ``result + lora_B(...) * scaling`` (the base output, the branch and
      its scaled copy at once; a fused gate_up_proj's output is both halves); LoRA on a map whose input is 16-bit
      makes that input's fp32 copy for the fp32 adapter (``x = self._cast_input_dtype(x, lora_A.weight.dtype)``,
      alive through the branch): the gate/up input (h x 4), or down_proj's (I x 4, with autocast's 16-bit cast of it
      for lora_A, beside the MLP's product, a fused gate_up's output and down_proj's base output);
    - eager attention's softmax (``softmax(scores, dtype=float32)``): the masked scores (the additive mask, in the
      embeddings' dtype, promotes them to the residual bytes), their fp32 copy (ATen's ``softmax`` converts the
      input first unless it is fp32, or fp16 on CUDA) and the fp32 output (4), beside the rotated q and k (residual
      bytes), v (a), and ``repeat_kv``'s copies of k and v for every head (grouped KV heads).
    """
    a, h, rb = s.act_bytes, s.facts.hidden_size, residual_bytes(s)
    eager = s.eager and kind.mixer in ("attention", "mla")
    heads = _split(kind.dims["heads"], s.tp) if eager else 0
    span = attention_span(s)
    mlp = tokens * (4 if kind.dims.get("fused_gate_up") else 3) * a * mlp_width(s, kind)
    targets = {lin.name.split(".")[-1] for lin in lora_linears(s, kind) if lin.is_nn_linear}
    cast = s.kind != "full" and not (s.distributed == "deepspeed" and s.zero is not None and s.mixed)  # fp32 adapters
    width = mlp_width(s, kind) if kind.mlp == "dense" else kind.dims.get("shared_width", 0) / s.tp
    if targets & {"gate_proj", "up_proj", "gate_up_proj"}:
        mlp += (2 if kind.dims.get("fused_gate_up") else 1) * tokens * width * a
        if cast and rb != 4:
            mlp += tokens * h * 4
    if "down_proj" in targets and cast and a != 4:
        alive = (3 if kind.dims.get("fused_gate_up") else 1) * a  # the product (and a fused gate_up's output)
        down = tokens * width * (alive + 4 + (2 if s.mixed else 0)) + tokens * h * a
        mlp = max(mlp, down)
    mlp += tokens * h * rb + tokens * heads * span * rb
    if not eager:
        return mlp
    d = kind.dims
    kv_heads, qk, v = _split(d["kv_heads"], s.tp), d["head_dim"], d.get("v_dim", d["head_dim"])
    qkv = (heads + kv_heads) * qk * rb + kv_heads * v * a
    if 1 < kv_heads < heads:  # repeat_kv: expand + reshape copies k and v to every head (a view for one KV head)
        qkv += heads * (qk * rb + v * a)
    softmax = tokens * heads * span * (rb + (4 if rb != 4 else 0) + 4) + tokens * qkv
    return max(mlp, softmax)
