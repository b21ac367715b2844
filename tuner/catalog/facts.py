"""A model's architecture facts (parameters by kind, PEFT targets, activation shapes) read from its module inventory.

What each decoder layer is (attention, latent attention, gated delta net; dense or MoE) comes from
:mod:`tuner.catalog.layer_kinds`; where a model's config comes from is :mod:`tuner.catalog.models`' concern.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from tuner.catalog.inventory import LANGUAGE_MODEL, PARTS, Inventory, ModuleGroup
from tuner.catalog.inventory_store import inventory_for, with_lora
from tuner.catalog.layer_kinds import LayerKind, LinearLayer, classify
from tuner.catalog.model_config import ModelConfigError, UnknownModelError, check_config
from tuner.catalog.peft_targets import PeftTargets, adapted_groups, peft_targets


@dataclass(frozen=True)
class ParamCounts:
    embeddings: int
    attention: int  # every layer's token mixer (attention, latent attention, linear attention)
    mlp: int  # every layer's MLP or MoE block
    norms: int
    lm_head: int
    other: int = 0  # parts the layer kinds do not cover (a vision tower, a layer's extra blocks)

    @property
    def total(self) -> int:
        return self.embeddings + self.attention + self.mlp + self.norms + self.lm_head + self.other

    def as_dict(self) -> dict[str, int]:
        return {"embeddings": self.embeddings, "attention": self.attention, "mlp": self.mlp,
                "norms": self.norms, "lm_head": self.lm_head, "other": self.other, "total": self.total}


@dataclass(frozen=True)
class ModelFacts:
    """The numbers of one causal LM that decide its memory, and its inventory."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int = 0  # 0 for dense models (the most experts of any layer)
    experts_per_token: int = 0
    max_position_embeddings: int | None = None
    source: str = "catalog"
    notes: tuple[str, ...] = ()
    attn_logit_softcapping: float | None = None  # Gemma-2: tanh-capped attention scores (eager keeps their tanh)
    final_logit_softcapping: float | None = None  # Gemma-2: tanh-capped logits (another T x V kept for backward)
    inventory_key: str = ""  # the config's sha256: two facts with equal numbers but other trees differ here
    tp: int = 1  # the tensor-parallel ranks this is one rank's share for (tuner.planner.rank_setup.rank_facts)
    trust_remote_code: bool = False  # what building it again (to measure PEFT's targets) may run
    code_folder: str = ""  # where its own code is (config.json and the .py files its auto_map names), if trusted
    inventory: Inventory | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @cached_property
    def _kinds(self) -> tuple[tuple[LayerKind, ...], tuple[str, ...]]:
        return classify(self.inventory, self.hidden_size, self.num_heads, self.inventory.config)

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """The decoder layers grouped by structure (one kind for a uniform model)."""
        return self._kinds[0]

    @property
    def unmodelled(self) -> tuple[str, ...]:
        """Every part of the model no planner term covers, with the layers it is in: no verdict can be given."""
        layers: dict[str, list[int]] = {}
        for kind in self.layer_kinds:
            for part in kind.unmodelled:
                layers.setdefault(part, []).extend(kind.layers)
        parts = [f"{part} (layers {_ranges(indices)})" for part, indices in layers.items()]
        return tuple(parts + [f"{part} (outside the decoder layers)" for part in self._text_path_outside()[1]])

    def _text_path_outside(self) -> tuple[list[ModuleGroup], list[str]]:
        """Groups outside the decoder layers that are neither embeddings, norms nor the head: (those on a separate
        branch, such as a vision tower, which text-only training never runs; those on the text path)."""
        inventory = self.inventory
        base = inventory.layers_path.rsplit(".", 1)[0] if "." in inventory.layers_path else ""
        branch, on_path = [], []
        for group in inventory.outside_layers():
            if group.kind in ("embedding", "output", "norm", "block"):
                continue
            if base and not group.pattern.startswith(base + "."):
                branch.append(group)
            else:
                on_path.append(f"{group.pattern} ({group.module})")
        return branch, on_path

    def layer_linears(self) -> tuple[LinearLayer, ...]:
        """The linear maps of the first layer of the most common kind (a uniform model's one layer)."""
        return max(self.layer_kinds, key=lambda kind: kind.count).linears

    @cached_property
    def param_counts(self) -> ParamCounts:
        return _param_counts(self)

    @property
    def total_params(self) -> int:
        return self.param_counts.total

    @cached_property
    def lora_inventory(self) -> Inventory:
        """The inventory with PEFT's targets measured (built on the meta device the first time a LoRA plan of an
        uncatalogued model asks; shipped for the catalog)."""
        return with_lora(self.inventory, self.source, self.trust_remote_code, self.code_folder or None)

    def peft_targets(self, target_modules: list[str] | str, target_parameters=()) -> PeftTargets:
        return peft_targets(self.lora_inventory, target_modules, tuple(target_parameters))

    def lora_params(self, r: int, target_modules: list[str] | str, target_parameters=(), parts=PARTS) -> int:
        """LoRA parameters PEFT adds for these targets at rank ``r`` (PEFT's own counts, per module, from the
        inventory): r x (in + out) for an nn.Linear, r x experts x (in + out) for a fused expert tensor; of an
        image-text model, only those in ``parts`` (``method.train``: the targets are resolved inside them)."""
        targets = self.peft_targets(target_modules, target_parameters)
        inventory = self.lora_inventory
        per_rank = sum(coefficient * self._share(group) for group, coefficient in adapted_groups(inventory, targets)
                       if inventory.part_of(group) in parts)
        return round(r * per_rank)

    def lora_groups(self, target_modules: list[str] | str, target_parameters=(), parts=PARTS) -> list[ModuleGroup]:
        """The module groups PEFT puts an adapter on for these targets, in ``parts`` of an image-text model."""
        inventory = self.lora_inventory
        targets = self.peft_targets(target_modules, target_parameters)
        return [group for group, _ in adapted_groups(inventory, targets) if inventory.part_of(group) in parts]

    def frozen_params(self, train) -> int:
        """Parameters of the parts of an image-text model ``method.train`` leaves frozen (0 for a causal LM)."""
        return self.inventory.part_params([part for part in self.inventory.parts if part not in train])

    def adapts_parameters(self, target_modules: list[str] | str, target_parameters=()) -> bool:
        """Whether these targets make PEFT adapt a parameter directly (fused experts: lora.ParamWrapper)."""
        targets = self.peft_targets(target_modules, target_parameters)
        return any(name or group.kind == "experts" for group, _, name in
                   adapted_groups(self.lora_inventory, targets, with_names=True))

    def targeted_linears(self, kind: LayerKind, target_modules: list[str] | str, target_parameters=()):
        """The linear maps of one layer of ``kind`` that carry a LoRA adapter."""
        targets = self.peft_targets(target_modules, target_parameters)
        adapted = {self.inventory.relative(group) + (f".{name}" if name else "")
                   for group, _, name in adapted_groups(self.lora_inventory, targets, with_names=True)}
        return [lin for lin in kind.linears if lin.name in adapted or f"{lin.name}.weight" in adapted
                or lin.name.rsplit(".", 1)[0] in adapted]

    def quantizable_params(self) -> int:
        """Weights bitsandbytes quantises: exactly the nn.Linear weights transformers' rule replaces (not biases,
        not the output head, not fused experts or routers)."""
        return sum(group.weight_numel for group in self.inventory.groups if group.quantized)

    def quantized_rows(self) -> int:
        """Output rows of the quantised weights (LLM.int8() keeps an fp32 scale per row)."""
        return sum(group.params["weight"][0] * group.instances for group in self.inventory.groups
                   if group.quantized and "weight" in group.params)

    def largest_module_params(self) -> int:
        """Parameters of the largest single module (what ZeRO-3 gathers at once: for fused experts, every expert
        of a layer)."""
        return max(group.own_numel for group in self.inventory.groups)

    def largest_layer_params(self) -> int:
        return max(kind.params for kind in self.layer_kinds)

    def active_params(self) -> int:
        """Parameters one token runs through: the experts it is routed to, not all of them."""
        total = self.total_params
        for kind in self.layer_kinds:
            if kind.mlp == "moe":
                experts = kind.dims["experts"]
                expert_params = sum(lin.weight_params for lin in kind.linears if not lin.is_nn_linear
                                    and ".experts." in f".{lin.name}.")
                total -= kind.count * expert_params * (experts - kind.dims["top_k"]) // experts
        return total

    def _share(self, group: ModuleGroup) -> float:
        """The share of a group one tensor-parallel rank holds (1 without tensor parallelism)."""
        return 1.0 if self.tp == 1 else _tp_share(self.inventory, group, self.tp)

    def as_dict(self) -> dict:
        return {
            "name": self.name, "model_type": self.model_type, "source": self.source,
            "architecture": self.inventory.architecture if self.inventory else None,
            "hidden_size": self.hidden_size, "num_layers": self.num_layers, "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size, "tie_word_embeddings": self.tie_word_embeddings,
            "num_experts": self.num_experts, "experts_per_token": self.experts_per_token,
            "max_position_embeddings": self.max_position_embeddings, "params": self.param_counts.as_dict(),
            "layer_kinds": [kind.describe() for kind in self.layer_kinds], "unmodelled": list(self.unmodelled),
            "notes": list(self.notes),
        }


def _ranges(indices) -> str:
    """0-2,5,7-9"""
    indices = sorted(indices)
    parts, start = [], None
    for i, index in enumerate(indices):
        if start is None:
            start = index
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            parts.append(str(start) if start == index else f"{start}-{index}")
            start = None
    return ",".join(parts)


def _category(facts: ModelFacts, group: ModuleGroup, kinds: dict[int, LayerKind]) -> str:
    if group.kind == "embedding" and not group.layers:
        return "embeddings"
    if group.kind == "output":
        return "lm_head"
    if not group.layers:
        return "norms" if group.kind == "norm" else "other"
    relative = facts.inventory.relative(group)
    kind = kinds[group.layers[0]]
    head = relative.split(".", 1)[0]
    if "." not in relative and group.kind == "norm":
        return "norms"
    if head == kind.dims.get("mixer_path"):
        return "attention"
    if head == kind.dims.get("mlp_path") or (kind.mlp == "dense" and head not in (kind.dims.get("mixer_path"),)
                                            and not any(head in part for part in kind.unmodelled)):
        return "mlp"
    return "other"


def _param_counts(facts: ModelFacts) -> ParamCounts:
    kinds = {index: kind for kind in facts.layer_kinds for index in kind.layers}
    totals = dict.fromkeys(("embeddings", "attention", "mlp", "norms", "lm_head", "other"), 0.0)
    for group in facts.inventory.groups:
        if group.numel:
            totals[_category(facts, group, kinds)] += group.numel * facts._share(group)
    return ParamCounts(**{key: math.ceil(value) for key, value in totals.items()})


def _tp_style(inventory: Inventory, pattern: str) -> str:
    base = inventory.layers_path.rsplit(".", 1)[0] + "." if "." in inventory.layers_path else ""
    return inventory.tp_plan.get(pattern[len(base):] if pattern.startswith(base) else pattern, "")


def _tp_share(inventory: Inventory, group: ModuleGroup, tp: int) -> float:
    """How much of a group one of ``tp`` ranks holds under the model's own tensor-parallel plan
    (``base_model_tp_plan``): column-wise layers keep 1/tp of their outputs (and biases), row-wise ones 1/tp of their
    inputs (the bias whole); a fused expert tensor is split along the same side; norms and routers stay whole."""
    if not group.numel:
        return 1.0
    held = 0.0
    for name, shape in group.params.items():
        style = _tp_style(inventory, f"{group.pattern}.{name}") or _tp_style(inventory, group.pattern)
        size = math.prod(shape)
        if "colwise" in style or ("rowwise" in style and name != "bias"):
            held += size / tp
        else:
            held += size
    return held / group.own_numel


def _config_int(config: dict, *keys: str, default: int = 0) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _softcapping(config: dict) -> dict[str, float | None]:
    """Gemma-2's logit soft-capping as transformers resolved the config (its class's defaults filled in)."""
    values = {key: config.get(key) for key in ("attn_logit_softcapping", "final_logit_softcapping")}
    return {key: float(value) if isinstance(value, (int, float)) and value else None for key, value in values.items()}


def facts_from_inventory(inventory: Inventory, name: str, source: str, trust_remote_code: bool = False) -> ModelFacts:
    """The planner's numbers from a model's inventory (its text config, as transformers resolved it)."""
    config = inventory.config
    hidden = _config_int(config, "hidden_size", "n_embd", "d_model")
    heads = _config_int(config, "num_attention_heads", "n_head", default=1)
    # the token embedding: the language model's first (an image-text model's tower comes first in its module tree,
    # and its position embedding is no vocabulary: Gemma 3 was planned with 4,096 "tokens" instead of 262,208)
    embedding = next((group for group in inventory.outside_layers()
                      if group.kind == "embedding" and inventory.part_of(group) == LANGUAGE_MODEL), None)
    output = next((group for group in inventory.groups if group.kind == "output"), None)
    vocab = (embedding.params.get("weight") or [0])[0] if embedding else _config_int(config, "vocab_size")
    tied = output is not None and not output.params
    facts = ModelFacts(
        name=name, model_type=inventory.model_type, hidden_size=hidden, num_layers=inventory.num_layers,
        num_heads=heads, num_kv_heads=_config_int(config, "num_key_value_heads", default=heads),
        head_dim=_config_int(config, "head_dim", default=hidden // heads if heads else 0),
        intermediate_size=_config_int(config, "intermediate_size", "moe_intermediate_size", "ffn_dim", "n_inner",
                                      default=4 * hidden),
        vocab_size=vocab, tie_word_embeddings=tied,
        max_position_embeddings=_config_int(config, "max_position_embeddings") or None,
        **_softcapping(config), source=source, inventory_key=inventory.config_sha256, trust_remote_code=trust_remote_code,
        inventory=inventory)
    moe = [kind for kind in facts.layer_kinds if kind.mlp == "moe"]
    if moe:
        facts = replace(facts, num_experts=max(kind.dims["experts"] for kind in moe),
                        experts_per_token=max(kind.dims["top_k"] for kind in moe))
    notes = []
    branch, _ = facts._text_path_outside()
    if branch and not inventory.image_text:  # an image-text model's parts are the plan's (tuner.planner.vision)
        parts = sorted({group.pattern.split(".")[min(1, group.pattern.count("."))] for group in branch})
        notes.append(f"{', '.join(parts)}: weights counted, not run by text-only training (no activations).")
    return replace(facts, notes=tuple(notes))


def facts_from_config(config: dict, name: str, source: str, trust_remote_code: bool = False,
                      code_folder: Path | None = None) -> ModelFacts:
    """Architecture facts from a config.json mapping: checked, then its inventory (shipped, cached or built on the
    meta device; a trusted model's own code is read from ``code_folder``)."""
    check_config(config, source)
    try:
        inventory = inventory_for(config, source, trust_remote_code, code_folder)
    except ModelConfigError as exc:
        raise UnknownModelError(str(exc)) from None
    return replace(facts_from_inventory(inventory, name, source, trust_remote_code),
                   code_folder=str(code_folder) if code_folder else "")
