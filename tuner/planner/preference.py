"""Memory terms of preference training (dpo, kto) with TRL 1.16's trainers; each has a source in docs/memory.md.

- **The reference model** ``[trl-reference]``: full fine-tuning keeps a frozen second copy of the starting model,
  prepared like the policy (DeepSpeed ZeRO-1/2 gives it a stage-0 engine, ZeRO-3 shards it, FSDP2 shards it at the
  root only, so its forward gathers it whole).  LoRA/QLoRA: the policy with the adapter disabled, no copy.
  ``precompute_ref_log_probs``: no copy while training; a pass before training with its own peak.
- **The doubled batch** ``[trl-dpo]``: DPO stacks each pair's chosen and rejected sequences in one forward.
- **TRL's fused log-prob head** ``[trl-fused-head]``: log-probabilities are computed in tiles of 4096 tokens x 32768
  vocabulary entries instead of the full logits; its forward and backward transients replace SFT's T x V buffers.
"""
from __future__ import annotations

from tuner.planner.kernels import TRITON_FOLD
from tuner.planner.items import ALWAYS, FORWARD_BACKWARD, GIB, SCORING, Item

REFERENCE = "reference_model"  # the plan's category of the reference model's weights
TILE_TOKENS = 4096  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE
TILE_VOCAB = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE: the tile buffer's width, whatever the vocabulary
# fp32 tiles the torch fold of one tile holds at once without Triton (CPU), a boolean tile counting 1/4:
CPU_FORWARD_TILES = 3.25  # logits, their exponentials and product, and the mask of the entries before the target
CPU_BACKWARD_TILES = 7.25  # scaled logits, logits, log-probabilities, probabilities, gradient, two products; target mask


def sequences_per_sample(objective: str) -> int:
    """Sequences one sample puts through the policy's forward: DPO and a reward model stack chosen and rejected
    ``[trl-dpo]``, ``[trl-reward]``."""
    return 2 if objective in ("dpo", "reward") else 1


def reference_items(s, gpu: list[Item], host: list[Item]) -> tuple[list[Item], list[Item]]:
    """The frozen reference copy beside the policy, on the GPU and in host RAM: the policy's resident weight items
    again (full fine-tuning without precomputed log-probabilities); under FSDP also the whole model, which its
    root-only sharding gathers to run its forward."""
    if not s.reference or s.kind != "full" or s.precompute:
        return [], []

    def copies(items: list[Item]) -> list[Item]:
        return [Item(f"reference model (frozen copy): {item.name}", REFERENCE, item.bytes, ALWAYS, "trl-reference")
                for item in items if item.category == "weights" and item.phase == ALWAYS
                and item.source != "ds-estimator"]  # ZeRO-3's gathered modules are the policy's working buffers

    if s.distributed != "fsdp":
        return copies(gpu), copies(host)
    # FSDP2: TRL's prepare_fsdp shards the reference in its own dtype (no fp32 upcast), at the root module only
    counts, compute = s.facts.param_counts, 2 if s.mixed else s.weight_bytes
    group = s.shard_group if s.fsdp != "no_shard" else 1
    shard = Item(f"reference model (frozen copy, FSDP shard 1/{group})", REFERENCE, counts.total * s.weight_bytes / group,
                 ALWAYS, "trl-reference")
    gathered = Item("reference model gathered whole for its forward (TRL shards it at the root only)", REFERENCE,
                    counts.total * compute, SCORING if s.rollout else FORWARD_BACKWARD, "trl-reference")
    if s.offload_params != "none":
        return [gathered], [shard]
    return [shard, gathered], []


def _tile(s, tokens: int) -> tuple[int, int]:
    """(tokens, vocabulary entries) of one tile of the fused head."""
    return min(tokens, TILE_TOKENS), min(s.facts.vocab_size, TILE_VOCAB)


def head_transient_bytes(s, tokens: int, backward: bool) -> float:
    """Bytes the fused head allocates beyond what autograd keeps: the tile buffer (always 32768 wide), the fold's
    fp32 tiles of the torch fold (no Triton: the CPU, or a GPU machine without triton), and in backward the fp32 gradients of its input and, when it trains, its weight."""
    f = s.facts
    rows, width = _tile(s, tokens)
    compute = s.act_bytes
    total = rows * TILE_VOCAB * compute
    if s.logprob_fold != TRITON_FOLD:
        total += (CPU_BACKWARD_TILES if backward else CPU_FORWARD_TILES) * rows * width * 4
    if backward:
        total += tokens * f.hidden_size * 4
        if s.kind == "full":
            total += f.vocab_size * f.hidden_size * 4
    return total


def fold_note(s) -> list[str]:
    """What the other fold of TRL's fused head would change: the Triton fold planned, the torch fold's fp32 tiles
    (the GPU run of a machine without triton) are that much more at the loss moment; and the reverse."""
    if s.logprob_fold is None or not s.on_gpu:
        return []
    rows, width = _tile(s, s.batch * s.seq)
    extra = (CPU_BACKWARD_TILES * rows * width * 4) / GIB
    if s.logprob_fold == TRITON_FOLD:
        return [f"dpo/kto: with TRL's torch fold instead (no triton on the training machine) the loss moment needs "
                f"{extra:.2f} GiB more (fp32 tiles of {rows} x {width}); tuner doctor there says which fold runs."]
    return [f"dpo/kto: the torch fold's fp32 tiles are {extra:.2f} GiB of the loss moment; with triton installed "
            "TRL's Triton fold needs none of them."]


def layer_forward_bytes(s, tokens: int) -> float:
    """The largest transient of one decoder layer's forward without gradients (tuner.planner.layers)."""
    from tuner.planner.layers import forward_transient_bytes, largest

    return largest(forward_transient_bytes, s, tokens)


def loss_items(s) -> list[Item]:
    """What TRL's loss adds at the end of the forward, in place of SFT's logits: the largest of the policy head's
    forward and backward transients and the reference's forward (which run one after the other)."""
    tokens = s.batch * s.seq
    policy = max(head_transient_bytes(s, tokens, backward=False), head_transient_bytes(s, tokens, backward=True))
    reference = 0.0
    if not s.precompute:
        reference = max(head_transient_bytes(s, tokens, backward=False), layer_forward_bytes(s, tokens))
    label = "fused log-prob head (tiles of 4096 tokens x 32768)" + (
        "" if s.precompute or policy >= reference else ", at the reference's forward")
    return [Item(label, "logits_loss", max(policy, reference), FORWARD_BACKWARD, "trl-fused-head")]


def reference_pass_items(s, resident: list[Item], overhead: list[Item]) -> list[Item]:
    """The precompute pass before training: the weights and one micro-batch's forward without gradients."""
    tokens = s.batch * s.seq
    weights = [Item(item.name, item.category, item.bytes, ALWAYS, item.source) for item in resident
               if item.category == "weights" and item.phase == ALWAYS]
    forward = max(head_transient_bytes(s, tokens, backward=False), layer_forward_bytes(s, tokens))
    hidden = tokens * s.facts.hidden_size * s.act_bytes
    return weights + [
        Item("forward without gradients: one layer's or the fused head's transient, and the hidden states",
             "activations", forward + 2 * hidden, ALWAYS, "trl-reference"),
    ] + [Item(item.name, item.category, item.bytes, ALWAYS, item.source) for item in overhead]
