"""What each rank of a model split over ranks holds: tensor-parallel slices (every rank computes every layer on its
share of the split weights) or pipeline stages (each rank computes its run of whole layers, transformers'
``layer_range_for_rank``), with its KV cache and, for stages, the buffers in flight between them.

Each rank measures what it holds once loaded (:func:`rank_bytes`, :func:`stage_held`) and rank 0 gathers the
numbers; the KV cache and buffers are predicted from the planner's model facts, as for device_map="auto"
(:mod:`tuner.infer.placement`). Nothing here imports torch at module level.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tuner.infer.placement import format_bytes, kv_bytes_per_value, kv_cache_bytes


def _facts_of(model, facts):
    from tuner.catalog.facts import facts_from_config

    return facts or facts_from_config(model.config.to_dict(), model.name_or_path, "the model config")


@dataclass(frozen=True)
class RankShare:
    """One row of the tensor-parallel table: what one rank holds (its slices of the split weights, a whole copy of
    the replicated ones) and its slice of the KV cache."""

    rank: int
    device: str
    split_bytes: int
    replicated_bytes: int
    kv_cache_bytes: int
    budget_bytes: int | None
    HELD = "weights + KV cache"

    @property
    def weights_bytes(self) -> int:
        return self.split_bytes + self.replicated_bytes

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes


@dataclass(frozen=True)
class RankPlacement:
    """What every rank of a split model holds, one row per rank, at the batch and context planned for."""

    ranks: tuple
    batch: int
    context: int
    total_layers: int
    headroom_bytes: int = 0
    facts_from: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    ROW = "rank"  # what a row is, and the flag that makes more of them
    MORE = "--tp"

    def warnings(self) -> list[str]:
        return [f"{self.ROW} {row.rank} ({row.device}): {row.HELD} ({format_bytes(row.total_bytes)}) exceed the "
                f"GPU's {format_bytes(row.budget_bytes + self.headroom_bytes)}; lower --batch-size or --context, or "
                f"use more {self.ROW}s ({self.MORE})."
                for row in self.ranks
                if row.budget_bytes is not None and row.total_bytes > row.budget_bytes + self.headroom_bytes]


@dataclass(frozen=True)
class TensorParallelPlacement(RankPlacement):
    """Every rank of a tensor-parallel model: each computes every layer on its slice of the split weights."""

    split: tuple[str, ...] = ()  # "q_proj (colwise)": the plan's rules, as the model applied them
    replicated: tuple[str, ...] = ()  # parameters every rank holds whole, e.g. "input_layernorm"

    def table(self):
        return tensor_parallel_table(self)


def rank_bytes(model) -> tuple[int, int]:
    """(split, replicated) bytes this rank of a model loaded with transformers' tensor-parallel plan holds: a split
    weight is a DTensor sharded over the ranks, and its local slice is what this rank stores."""
    from torch.distributed.tensor import DTensor

    held = [0, 0]
    for tensor in [*model.parameters(), *model.buffers()]:
        split = isinstance(tensor, DTensor) and any(placement.is_shard() for placement in tensor.placements)
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        held[0 if split else 1] += local.numel() * local.element_size()
    return held[0], held[1]


def plan_names(model) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The split modules with the plan's style (``q_proj (colwise)``), and the parameters every rank holds whole."""
    import re

    from torch.distributed.tensor import DTensor

    split = tuple(f"{rule.rpartition('.')[2]} ({style})" for rule, style in model.tp_plan.items())
    whole = {re.sub(r"\.\d+\.", ".", name).removesuffix(".weight").rpartition(".")[2]: None
             for name, tensor in model.named_parameters() if not isinstance(tensor, DTensor)}
    return split, tuple(whole)


def tensor_parallel_placement(model, held: list[tuple[str, int, int, int | None]], batch: int, context: int,
                              headroom_bytes: int = 0, notes: tuple[str, ...] = (),
                              facts=None) -> TensorParallelPlacement:
    """The placement of a tensor-parallel model from rank 0's model and what every rank holds
    (``held[rank]``: device, split bytes, replicated bytes, budget); k_proj and v_proj split the KV heads, so
    each rank keeps 1/tp of the KV cache."""
    facts = _facts_of(model, facts)
    kv = kv_cache_bytes(facts, batch, context, kv_bytes_per_value(model)) // len(held)
    rows = tuple(RankShare(rank, device, split_bytes, replicated_bytes, kv, budget)
                 for rank, (device, split_bytes, replicated_bytes, budget) in enumerate(held))
    split, replicated = plan_names(model)
    return TensorParallelPlacement(rows, batch, context, facts.num_layers, headroom_bytes, getattr(facts, "source", ""),
                                   notes, split=split, replicated=replicated)


def tensor_parallel_table(placement: TensorParallelPlacement):
    """The tensor-parallel placement as a rich table (one row per rank, then the total), shaped like
    :func:`tuner.infer.placement.placement_table`."""
    from rich.table import Table

    caption = (f"every rank computes all {placement.total_layers} layers on its slice; "
               f"weights split: {', '.join(placement.split)}; replicated: {', '.join(placement.replicated) or 'nothing'}\n"
               f"KV cache at batch {placement.batch} × context {placement.context} tokens, split by KV heads "
               f"(model facts: {placement.facts_from})")
    table = Table(title=f"Tensor-parallel placement ({len(placement.ranks)} ranks)", title_justify="left",
                  caption=caption, caption_justify="left")
    for column in ("rank", "split", "replicated", "KV cache", "weights + KV", "budget"):
        table.add_column(column, justify="left" if column == "rank" else "right")
    for row in placement.ranks:
        budget = "-" if row.budget_bytes is None else format_bytes(row.budget_bytes)
        table.add_row(f"{row.rank} ({row.device})", format_bytes(row.split_bytes), format_bytes(row.replicated_bytes),
                      format_bytes(row.kv_cache_bytes), format_bytes(row.total_bytes), budget)
    table.add_section()
    total = [sum(getattr(row, name) for row in placement.ranks)
             for name in ("split_bytes", "replicated_bytes", "kv_cache_bytes", "total_bytes")]
    table.add_row("total", *map(format_bytes, total), "")
    return table


@dataclass(frozen=True)
class StageShare:
    """One row of the pipeline table: the run of layers one rank computes ([first_layer, end_layer)), the weights it
    kept, its layers' KV cache, and the hidden states and logits it sends or receives for one forward pass."""

    rank: int
    device: str
    first_layer: int
    end_layer: int
    weights_bytes: int
    kv_cache_bytes: int
    buffers_bytes: int
    budget_bytes: int | None
    HELD = "weights + KV cache + buffers"

    @property
    def layers(self) -> int:
        return self.end_layer - self.first_layer

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.buffers_bytes


@dataclass(frozen=True)
class PipelinePlacement(RankPlacement):
    """Every stage of a pipeline-parallel model: rank 0 embeds the tokens and runs the first layers, each later rank
    the next ones on the hidden states it receives; the last rank's logits are broadcast to every rank."""

    ROW = "stage"
    MORE = "--pp"

    def table(self):
        return pipeline_table(self)


def stage_held(model) -> tuple[int, int, int]:
    """(first layer, end layer, bytes) of this rank's pipeline stage: the layers transformers gave it
    (``layer_range_for_rank``) and the parameters and buffers it kept (the layers of other stages are
    ``PipelineIdentityLayer`` s, which hold nothing)."""
    stage = model._pp_stage
    first, end = stage.layer_range_for_rank(stage.pp_rank, len(getattr(model, model.base_model_prefix).layers))
    held = sum(tensor.numel() * tensor.element_size() for tensor in [*model.parameters(), *model.buffers()])
    return first, end, held


def stage_buffers_bytes(facts, batch: int, tokens: int, bytes_per_value: int, *, first: bool, last: bool) -> int:
    """What one forward pass of ``pipeline_parallel_naive_forward`` moves through a stage: the hidden states it
    receives (all but the first stage) and sends (all but the last), batch x tokens x hidden_size each, and the
    logits every stage receives from the last (``broadcast_from_last``; generate keeps the last position's,
    batch x vocab_size)."""
    hidden = batch * tokens * facts.hidden_size * bytes_per_value
    return hidden * ((not first) + (not last)) + batch * facts.vocab_size * bytes_per_value


def pipeline_placement(model, held: list[tuple[str, int, int, int, int | None]], batch: int, context: int,
                       headroom_bytes: int = 0, notes: tuple[str, ...] = (), facts=None) -> PipelinePlacement:
    """The placement of a pipeline-parallel model from rank 0's model and what every rank holds
    (``held[rank]``: device, first layer, end layer, bytes, budget): a stage caches keys and values of its own
    layers; the hidden states in flight are planned for a prompt as long as the context (the prefill)."""
    facts = _facts_of(model, facts)
    per_value = kv_bytes_per_value(model)
    last = len(held) - 1
    rows = tuple(StageShare(rank, device, first, end, weights,
                            kv_cache_bytes(facts, batch, context, per_value, layers=end - first),
                            stage_buffers_bytes(facts, batch, context, per_value, first=rank == 0, last=rank == last),
                            budget)
                 for rank, (device, first, end, weights, budget) in enumerate(held))
    return PipelinePlacement(rows, batch, context, facts.num_layers, headroom_bytes, getattr(facts, "source", ""),
                             notes)


def pipeline_table(placement: PipelinePlacement):
    """The pipeline placement as a rich table (one row per stage, then the total)."""
    from rich.table import Table

    caption = ("stages run one after another for every token (transformers' naive pipeline forward), each on its "
               "own layers; buffers: the hidden states received and sent, and the logits broadcast from the last "
               f"stage\nKV cache and buffers at batch {placement.batch} × context {placement.context} tokens "
               f"(model facts: {placement.facts_from})")
    table = Table(title=f"Pipeline placement ({len(placement.ranks)} stages)", title_justify="left",
                  caption=caption, caption_justify="left")
    for column in ("stage", "layers", "weights", "KV cache", "buffers", "total", "budget"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for row in placement.ranks:
        budget = "-" if row.budget_bytes is None else format_bytes(row.budget_bytes)
        table.add_row(f"{row.rank} ({row.device})", f"{row.first_layer}-{row.end_layer - 1} ({row.layers})",
                      format_bytes(row.weights_bytes), format_bytes(row.kv_cache_bytes),
                      format_bytes(row.buffers_bytes), format_bytes(row.total_bytes), budget)
    table.add_section()
    total = [sum(getattr(row, name) for row in placement.ranks)
             for name in ("weights_bytes", "kv_cache_bytes", "buffers_bytes", "total_bytes")]
    table.add_row("total", str(placement.total_layers), *map(format_bytes, total), "")
    return table
