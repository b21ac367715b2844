"""Expert parallelism per rank (``parallelism.ep``): which experts a rank holds and the buffers that move tokens to
them, as transformers 5.24's ``DistributedConfig(ep_size)`` lays them out (sourced in docs/memory.md, ``[ep]``).

- Experts per rank: ``num_experts / ep`` whole experts (``grouped_gemm`` shards the fused tensors' dim 0).
- Expert-FSDP: the ``efsdp = dp_shard x tp / ep`` ranks holding the same experts FSDP-shard them, so a rank keeps
  ``expert_params / (ep x efsdp)`` at rest (the same share plain FSDP over ``dp_shard x tp`` gives) and gathers only
  its own ``expert_params / ep`` for compute (nothing with efsdp 1), where FSDP without ep gathers every expert of a
  layer.
- The dense part (attention, norms, router, embeddings) is FSDP-sharded over ``dp_shard`` as without ep.
- Optimizer states follow the parameters: a rank's AdamW holds its experts' shard only.
- All-to-all buffers (``AllToAllEP``): per MoE layer a rank sends its ``tokens x top_k`` routed rows and receives
  the rows routed to its experts. transformers sets no capacity factor, so the router may send every row of the ep
  group to one rank: the plan counts that worst case, ``ep x tokens x top_k`` rows received (when the rank holds at
  least top_k experts), for one layer at a time (the buffers are freed when the layer's combine returns).
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog.facts import ModelFacts
from tuner.planner.items import BACKWARD, Item


@dataclass(frozen=True)
class ExpertShare:
    """One rank's experts under ep (all numbers in parameters)."""

    ep: int
    efsdp: int  # ranks holding the same experts, FSDP-sharding them
    experts: int  # experts of a MoE layer
    experts_per_rank: int
    expert_params: int  # the whole model's fused expert tensors
    layer_expert_params: int  # one MoE layer's

    @property
    def expert_params_per_rank(self) -> int:
        """What a rank computes with (gathered over efsdp): its experts of every layer."""
        return self.expert_params // self.ep

    @property
    def expert_params_at_rest(self) -> float:
        """What a rank keeps between steps: its experts, FSDP-sharded over efsdp."""
        return self.expert_params / (self.ep * self.efsdp)

    def line(self) -> str:
        return (f"expert parallelism (ep {self.ep}): {self.experts_per_rank} of {self.experts} experts per rank, "
                f"{self.expert_params_per_rank:,} expert parameters per rank of {self.expert_params:,} "
                f"(1/{self.ep}), FSDP-sharded over efsdp {self.efsdp}; routed tokens cross all-to-all, the plan "
                "counting the worst case the router allows (every routed row of the ep group to one rank).")


def _expert_linears(facts: ModelFacts):
    for kind in facts.layer_kinds:
        if kind.mlp == "moe":
            yield kind, [lin for lin in kind.linears if not lin.is_nn_linear and ".experts." in f".{lin.name}."]


def expert_share(facts: ModelFacts, ep: int, dp_shard: int, tp: int = 1) -> ExpertShare | None:
    """The rank's experts under ``ep`` over ``dp_shard x tp`` ranks (None without ep or for a dense model)."""
    if ep <= 1 or not facts.is_moe:
        return None
    total = layer = 0
    for kind, linears in _expert_linears(facts):
        per_layer = sum(lin.weight_params for lin in linears)
        total += kind.count * per_layer
        layer = max(layer, per_layer)
    return ExpertShare(ep=ep, efsdp=max(1, dp_shard * tp // ep), experts=facts.num_experts,
                       experts_per_rank=facts.num_experts // ep, expert_params=total, layer_expert_params=layer)


def gathered_layer_params(share: ExpertShare, whole_layer: float) -> float:
    """What FSDP unshards of a decoder layer for compute (and reduce-scatters of its gradients) under ep: the dense
    part, and this rank's experts only where efsdp > 1 ranks share them; with efsdp 1 a rank's experts are whole
    already and never gathered (traced on two gloo ranks, ep 2: no expert in the gathered parameters)."""
    own = share.layer_expert_params / share.ep if share.efsdp > 1 else 0.0
    return whole_layer - share.layer_expert_params + own


def dispatch_items(share: ExpertShare, facts: ModelFacts, tokens: int, act_bytes: int) -> list[Item]:
    """One MoE layer's all-to-all buffers on a rank, worst case: the rows it sends (tokens x top_k), the rows it
    receives (every rank's tokens x top_k, when it holds at least top_k experts), the experts' output of those
    rows, and the rows coming back with the combine's (tokens x top_k, hidden) gather."""
    k = facts.experts_per_token
    sent = tokens * k
    received = share.ep * tokens * min(k, share.experts_per_rank)
    rows = sent + 2 * received + 2 * sent
    return [Item(f"all-to-all dispatch of one MoE layer (worst case: {received:,} rows received, ep {share.ep} x "
                 f"{tokens:,} tokens x top-{min(k, share.experts_per_rank)})", "activations",
                 rows * facts.hidden_size * act_bytes, BACKWARD, source="ep")]
