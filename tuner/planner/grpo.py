"""Memory terms of online RL (grpo) with TRL 1.16's GRPOTrainer; each has a source in docs/memory.md.

A step of GRPO has a phase before the training step, **generation**, with three moments:

- **prefill** ``[grpo-prefill]``: each device generates for its whole round at once, B = micro_batch_size x
  steps_per_generation completions (``RepeatSampler``, ``_generate_single_turn``): the prompts' forward without
  gradients, the KV cache of B x P tokens and one layer's transient;
- **decoding** ``[grpo-kv-cache]``, ``[grpo-sampler]``: the KV cache of B x (P + C) tokens (transformers'
  DynamicCache grows by ``torch.cat``: one layer's K or V twice for a moment) and the sampler's B x V logits in
  fp32 through the logits processors (temperature, top-p) and the softmax (``GenerationMixin._sample``);
- **scoring** ``[grpo-scoring]``: the reference's (beta > 0) and the old policy's (when a round spans more
  optimizer steps than one) per-token log-probabilities, forwards without gradients in chunks of micro_batch_size
  sequences through TRL's fused head, and the reward models' forward on all B sequences at once.

The rollout's tensors (ids, masks, advantages, log-probabilities) stay buffered through the round
``[grpo-rollout]``.  The training step is the policy's forward and backward on micro_batch_size sequences of
P + C tokens, scored by the fused head on the completion tokens only (on a GPU; every position on the CPU,
without Triton) ``[trl-fused-head]``.  With vLLM in colocate mode the engine's share of the GPU replaces the
transformers KV cache and sampler ``[vllm-colocate]``; in server mode the server's GPUs are a device of their own.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.planner.items import (ALWAYS, DECODING, EVAL, FORWARD_BACKWARD, GENERATION_MOMENTS, GIB, MOMENTS, PREFILL,
                                 SCORING, Item)
from tuner.planner.preference import head_transient_bytes

REWARD_MODEL = "reward_model"  # the plan's category of the reward models' weights
GENERATION = "generation"  # the plan's category of what generating holds: KV cache, sampler, vLLM's share


@dataclass(frozen=True)
class Rollout:
    """A grpo recipe reduced to what its rollout's memory depends on."""

    generations: int  # num_generations
    prompt: int  # max_prompt_length
    completion: int  # max_completion_length
    steps_per_generation: int
    round: int  # completions one device generates at once: micro_batch_size x steps_per_generation
    old_log_probs: bool  # a round spans more than one optimizer step (or vLLM corrects its sampling): scored again
    reference: bool  # beta > 0
    temperature: float
    top_p: float
    backend: str  # transformers, vllm_colocate, vllm_server
    vllm_share: float  # vllm_gpu_memory_utilization
    vllm_sleep: bool
    vllm_gpus: int
    reward_models: tuple = ()  # ModelFacts of each reward model


def rollout_of(recipe) -> Rollout:
    from tuner.catalog.models import model_named_at

    grpo = recipe.objective.grpo
    vllm = grpo.generation != "transformers"
    from tuner.rundir.summary import adapter_base

    # a LoRA reward model is loaded on its base and merged: the base's weights
    models = tuple(model_named_at(f"objective.grpo.rewards.{number}.model", adapter_base(reward.model) or reward.model,
                                  recipe.model.trust_remote_code)
                   for number, reward in enumerate(grpo.rewards) if reward.kind == "model")
    return Rollout(
        generations=grpo.num_generations, prompt=grpo.max_prompt_length, completion=grpo.max_completion_length,
        steps_per_generation=grpo.steps_per_generation, round=recipe.training.micro_batch_size * grpo.steps_per_generation,
        old_log_probs=recipe.training.gradient_accumulation_steps % grpo.steps_per_generation != 0 or vllm,
        reference=recipe.objective.reference_model, temperature=grpo.temperature, top_p=grpo.top_p,
        backend=grpo.generation, vllm_share=grpo.vllm_gpu_memory_utilization, vllm_sleep=grpo.vllm_sleep_mode,
        vllm_gpus=grpo.vllm_server_gpus, reward_models=models)


def generation_bytes(s) -> int:
    """Bytes of an activation in generation: the module's dtype (DeepSpeed casts it to 16 bits under mixed
    precision; FSDP computes in 16 bits), since TRL generates outside autocast."""
    if s.distributed == "deepspeed" or s.distributed == "fsdp":
        return 2 if s.mixed else s.weight_bytes
    return s.weight_bytes


def scored_tokens(s, sequences: int) -> int:
    """Positions the fused head scores: the completion tokens on a GPU (Triton's compact path), every position of
    prompt + completion on the CPU."""
    r = s.rollout
    return sequences * (r.completion if s.on_gpu else r.prompt + r.completion)


def kv_cache_bytes(s, sequences: int, tokens: int) -> float:
    """K and V of every layer for ``sequences`` x ``tokens``."""
    f = s.facts
    return 2 * f.num_layers * sequences * tokens * f.kv_dim * generation_bytes(s)


def _forward_transient(s, sequences: int, tokens: int, element: int, intermediate: int, hidden: int) -> float:
    """One decoder layer's largest transient in a forward without gradients, beside the hidden states: the
    SwiGLU's gate, up and product (or eager attention's fp32 scores and their softmax), the attention mask."""
    f = s.facts
    mlp = 3 * intermediate * element * max(f.experts_per_token, 1)
    scores = f.num_heads * tokens * (4 + element) if s.eager else 0
    mask = 0 if s.flash else tokens * element
    return sequences * tokens * (max(mlp, scores) + mask + 2 * hidden * element)


def sampler_bytes(s, sequences: int) -> float:
    """The last position's logits and what the sampler makes of them, B x V each: the fp32 copy, the temperature's
    scaled scores, top-p's sorted scores, indices (int64), cumulative probabilities and mask, the probabilities."""
    r, vocab = s.rollout, s.facts.vocab_size
    per_entry = generation_bytes(s) + 4 + (4 if r.temperature != 1.0 else 0) + 4
    if r.top_p < 1.0:
        per_entry += 4 + 8 + 4 + 4 + 1
    return sequences * vocab * per_entry


def _prefill_items(s, sequences: int, phase) -> list[Item]:
    f, r, element = s.facts, s.rollout, generation_bytes(s)
    return [
        Item(f"KV cache of the prompts ({sequences} x {r.prompt} tokens)", GENERATION,
             kv_cache_bytes(s, sequences, r.prompt), phase, "grpo-prefill"),
        Item("prefill forward without gradients: one layer's transient and the hidden states, the last logits",
             "activations", _forward_transient(s, sequences, r.prompt, element, f.intermediate_size, f.hidden_size)
             + sequences * f.vocab_size * element, phase, "grpo-prefill"),
    ]


def _decoding_items(s, sequences: int, phase) -> list[Item]:
    f, r = s.facts, s.rollout
    tokens = r.prompt + r.completion
    return [
        Item(f"KV cache ({sequences} x {tokens} tokens: {f.num_layers} layers, K and V)", GENERATION,
             kv_cache_bytes(s, sequences, tokens), phase, "grpo-kv-cache"),
        Item("KV cache growing by torch.cat: one layer's K or V twice", GENERATION,
             sequences * tokens * f.kv_dim * generation_bytes(s), phase, "grpo-kv-cache"),
        Item(f"sampler: {sequences} x V logits through temperature/top-p and the softmax", GENERATION,
             sampler_bytes(s, sequences), phase, "grpo-sampler"),
    ]


def _scoring_bytes(s) -> tuple[float, str]:
    """The largest forward of the scoring moment and what it is: a chunk of log-probabilities (reference, old
    policy), or a reward model on the whole round."""
    f, r = s.facts, s.rollout
    tokens = r.prompt + r.completion
    candidates = []
    if r.reference or r.old_log_probs:
        chunk = s.batch
        forward = _forward_transient(s, chunk, tokens, s.act_bytes, f.intermediate_size, f.hidden_size)
        head = head_transient_bytes(s, scored_tokens(s, chunk), backward=False)
        what = " and ".join(name for name, used in (("reference", r.reference), ("old policy", r.old_log_probs)) if used)
        candidates.append((max(forward, head + chunk * tokens * f.hidden_size * s.act_bytes),
                           f"{what} log-probabilities of {chunk} sequences (a chunk)"))
    for model in r.reward_models:
        element = s.weight_bytes
        candidates.append((_forward_transient(s, r.round, tokens, element, model.intermediate_size, model.hidden_size),
                           f"reward model forward on all {r.round} sequences"))
    return max(candidates, default=(0.0, ""))


def rollout_buffer_bytes(s) -> float:
    """What a round keeps for its optimizer steps: prompt and completion ids and masks (int64), advantages, and the
    per-token log-probabilities that were scored (fp32)."""
    r = s.rollout
    tokens = r.prompt + r.completion
    log_probs = r.round * r.completion * 4 * (int(r.reference) + int(r.old_log_probs))
    return r.round * (2 * tokens * 8 + 4) + log_probs


def reward_model_items(s) -> list[Item]:
    """Each reward model's weights, in model.dtype (DeepSpeed's stage-0 engine casts it to 16 bits; ZeRO-3
    shards it): its backbone and a one-output score head in place of the LM head."""
    element = (2 if s.mixed else 4) if s.distributed == "deepspeed" else s.weight_bytes
    shards = s.zero_ranks if s.distributed == "deepspeed" and s.zero == 3 else 1
    return [Item(f"reward model weights ({model.name})" + (f" (ZeRO-3 shard 1/{shards})" if shards > 1 else ""),
                 REWARD_MODEL, (model.param_counts.total - model.param_counts.lm_head + model.hidden_size) * element
                 / shards, ALWAYS, "grpo-reward-model")
            for model in s.rollout.reward_models]


def rollout_items(s, step: list[Item], capacity_gib: float | None) -> list[Item]:
    """The training device's items with the rollout's: the generation phase, the round's buffers, the reward models.

    A round that starts with an optimizer step (steps_per_generation a multiple of the accumulation) generates after
    ``zero_grad``: the gradients kept between micro-steps are not live while it generates (DDP's buckets and ZeRO-3's
    partition buffer are, allocated once)."""
    r = s.rollout
    if r.steps_per_generation % s.accumulation == 0 and s.accumulation > 1:
        outside = tuple(m for m in MOMENTS if m not in GENERATION_MOMENTS)
        accumulated = ("torch-autograd", "fsdp") + (("zero",) if s.zero in (1, 2) else ())
        step = [Item(i.name, i.category, i.bytes, outside, i.source, i.level)
                if i.category == "gradients" and i.phase == ALWAYS and i.source in accumulated else i for i in step]
    items = step + reward_model_items(s)
    items.append(Item("rollout buffers: ids, masks, advantages, scored log-probabilities", "activations",
                      rollout_buffer_bytes(s), ALWAYS, "grpo-rollout"))
    if r.backend == "transformers":
        items += _prefill_items(s, r.round, PREFILL) + _decoding_items(s, r.round, DECODING)
        if s.distributed == "deepspeed" and s.zero == 3:  # TRL's ds3_gather_for_generation: the whole model
            items.append(Item("ZeRO-3 gathers the whole 16-bit model to generate (ds3_gather_for_generation)",
                              "weights", s.counts.total * (2 if s.mixed else 4), (PREFILL, DECODING), "grpo-prefill"))
        items += [Item(i.name + ", to generate", i.category, i.bytes, (PREFILL, DECODING, SCORING), i.source)
                  for i in step if i.source == "fsdp" and i.category == "weights" and i.phase != ALWAYS]
    elif r.backend == "vllm_colocate" and capacity_gib:
        phase = GENERATION_MOMENTS if r.vllm_sleep else ALWAYS
        items.append(Item(f"vLLM engine: {r.vllm_share:.0%} of the GPU (weights and KV cache pool"
                          + (", asleep during the training step)" if r.vllm_sleep else ")"), GENERATION,
                          r.vllm_share * capacity_gib * GIB, phase, "vllm-colocate", level="device"))
    scoring, what = _scoring_bytes(s)
    if scoring:
        items.append(Item(f"scoring without gradients: {what}", "activations", scoring, SCORING, "grpo-scoring"))
    return items


def loss_items(s) -> list[Item]:
    """What TRL's GRPO loss adds at the end of the forward: the fused head's forward and backward transients on the
    scored positions (the larger of the two), and the per-token loss terms on micro_batch_size x C."""
    r = s.rollout
    tokens = scored_tokens(s, s.batch)
    head = max(head_transient_bytes(s, tokens, backward=False), head_transient_bytes(s, tokens, backward=True))
    if s.on_gpu:  # the compact path gathers the scored positions' hidden states
        head += tokens * s.facts.hidden_size * s.act_bytes
    per_token = s.batch * r.completion * 4 * 12  # log-probs, entropy, ratios, clipped terms, KL, masks (fp32)
    return [Item("fused log-prob head on the scored positions (tiles of 4096 tokens x 32768)", "logits_loss", head,
                 FORWARD_BACKWARD, "trl-fused-head"),
            Item("GRPO's per-token terms (micro-batch x completion, fp32)", "logits_loss", per_token,
                 FORWARD_BACKWARD, "grpo-rollout")]


def eval_items(s) -> list[Item]:
    """Evaluation: a micro-batch of prompts generated for, scored and its loss computed, all without gradients."""
    r = s.rollout
    if r.backend != "transformers":
        return []
    tokens = r.prompt + r.completion
    decode = sum(i.bytes for i in _decoding_items(s, s.batch, EVAL))
    prefill = sum(i.bytes for i in _prefill_items(s, s.batch, EVAL))
    forward = _forward_transient(s, s.batch, tokens, s.act_bytes, s.facts.intermediate_size, s.facts.hidden_size)
    return [Item("evaluation: generating for a micro-batch of prompts, then its loss without gradients",
                 "activations", max(decode, prefill, forward + head_transient_bytes(s, scored_tokens(s, s.batch),
                                                                                    backward=False)),
                 EVAL, "grpo-kv-cache")]


def server_items(s, capacity_gib: float) -> list[Item]:
    """One GPU of the vLLM server (vllm_server): its share of the GPU, of which the weights (split over its
    tensor-parallel GPUs) and the rest its KV cache pool."""
    r, m = s.rollout, s.model
    weights = m.total_params * 2 / r.vllm_gpus
    share = r.vllm_share * capacity_gib * GIB
    return [Item(f"weights in 16 bits (tensor-parallel 1/{r.vllm_gpus})", "weights", weights, ALWAYS, "vllm-server"),
            Item("KV cache pool: the rest of its share", GENERATION, max(share - weights, 0.0), ALWAYS,
                 "vllm-server", level="reserved")]
