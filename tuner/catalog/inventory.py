"""A model's parameter inventory: what its real module tree holds, per module path pattern.

The planner reads a model's parameters from here, never from a family guess.  An inventory is made once from the
config on the meta device (:mod:`tuner.catalog.meta_inventory`, the only place that imports torch and transformers
for it) and is plain JSON afterwards: shipped for every catalog model (``tuner/catalog/inventories/``, so planning a
catalog model imports no torch), cached under ``$TUNER_HOME/inventories/<transformers version>/`` for every other
config, keyed by the config's content.

Per module path pattern (the decoder layer's index collapsed to ``*``) it records the module's class, its own
parameters' shapes, the layers it occurs in, what kind of tensor it is for memory (``linear``: an ``nn.Linear``;
``experts``: fused 3-D expert tensors; ``router``; ``embedding``; ``output``: the LM head; ``norm``; ``other``),
whether bitsandbytes quantises it (transformers' own rule), and what PEFT adapts when a recipe names it: LoRA
parameters per unit of rank, measured by ``get_peft_model`` on the meta model.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tuner.catalog.model_classes import CAUSAL_LM

# raised when an inventory's numbers change meaning (2: LoRA leaves out the linears PEFT cannot run)
INVENTORY_FORMAT = 2
SHIPPED_DIR = Path(__file__).with_name("inventories")
VOLATILE_KEYS = ("transformers_version", "_name_or_path", "_commit_hash")  # written by save_pretrained, not structure
KINDS = ("linear", "experts", "router", "embedding", "output", "norm", "other")
# The parts of an image-text model (a causal LM is all language model); what ``method.train`` chooses among
VISION_TOWER, PROJECTOR, LANGUAGE_MODEL = "vision_tower", "projector", "language_model"
PARTS = (VISION_TOWER, PROJECTOR, LANGUAGE_MODEL)


@dataclass(frozen=True)
class ModuleGroup:
    """Every module at one path pattern with the same class, own parameter shapes and attributes."""

    pattern: str  # e.g. model.layers.*.self_attn.q_proj (one * per list index; the first is the decoder layer's)
    module: str  # the class name, e.g. Linear or Qwen3MoeExperts
    kind: str  # one of KINDS
    params: dict[str, list[int]]  # its own parameters (recurse=False; a tied copy is listed once, at its first owner)
    layers: list[int]  # decoder layers it occurs in; [] outside the decoder layers
    instances: int  # modules that match (layers x list entries, e.g. experts kept as a ModuleList)
    attrs: dict = field(default_factory=dict)  # the module's plain attributes (head_dim, top_k, sliding_window, ...)
    quantized: bool = False  # bitsandbytes 4/8-bit replaces it (transformers' replace_with_bnb_linear rule)
    lora_excluded: bool = False  # an nn.Linear PEFT's LoRA cannot run (meta_inventory.unadaptable_linears): no adapter
    lora: float | None = None  # LoRA parameters per unit of rank, per instance, when target_modules names its leaf
    lora_all_linear: float = 0.0  # the same under target_modules: all-linear (0: not selected)
    lora_parameters: dict[str, float] = field(default_factory=dict)  # per rank, per instance, per target parameter

    @property
    def leaf(self) -> str:
        return self.pattern.rsplit(".", 1)[-1]

    @property
    def own_numel(self) -> int:
        """Parameters of one instance."""
        return sum(math.prod(shape) for shape in self.params.values())

    @property
    def numel(self) -> int:
        return self.own_numel * self.instances

    @property
    def weight_numel(self) -> int:
        """Parameters of every instance but the biases (what a quantiser replaces)."""
        return sum(math.prod(shape) for name, shape in self.params.items() if name != "bias") * self.instances

    @property
    def per_layer_instances(self) -> int:
        return self.instances // len(self.layers) if self.layers else self.instances

    def names(self) -> list[str]:
        """Every module path this group stands for (list indices beyond the decoder layer's shown as *)."""
        if not self.layers:
            return [self.pattern]
        return [self.pattern.replace("*", str(i), 1) for i in self.layers]


@dataclass(frozen=True)
class Inventory:
    """The parameters of one model as transformers builds it from its config."""

    architecture: str  # the class the auto class builds, e.g. Qwen3MoeForCausalLM
    model_type: str
    transformers_version: str
    peft_version: str
    config_sha256: str
    layers_path: str  # the decoder layers' ModuleList, e.g. model.layers
    num_layers: int
    groups: tuple[ModuleGroup, ...]
    tied: dict[str, str]  # parameter -> the parameter it is tied to (listed once, there)
    config: dict  # the text config as transformers resolved it (its defaults filled in)
    layer_types: list[str] = field(default_factory=list)  # config.layer_types where the model has one
    # PEFT's tables, filled with the LoRA counts (measure_lora): a full fine-tuning plan never imports PEFT
    peft_moe_mapping: dict[str, str] = field(default_factory=dict)  # PEFT's v4 name -> v5 parameter for this MoE
    peft_fused_targets: dict[str, list[str]] = field(default_factory=dict)  # v5 parameter -> v4 names fused in it
    tp_plan: dict[str, str] = field(default_factory=dict)  # config.base_model_tp_plan
    source_config: dict = field(default_factory=dict)  # the config it was built from (canonical_config)
    auto_class: str = CAUSAL_LM  # the auto class that built it (tuner.catalog.model_classes.auto_class_for)
    # an image-text model's parts, from its own module tree: part -> {"paths": module paths, "module": the class
    # name of the first, "params": parameters (tied ones once)}; empty for a causal LM (all language model)
    parts: dict[str, dict] = field(default_factory=dict)
    format: int = INVENTORY_FORMAT

    @property
    def lora_measured(self) -> bool:
        """Whether PEFT's targets were measured (the planner asks for them only for LoRA and QLoRA)."""
        return bool(self.peft_version)

    @property
    def total(self) -> int:
        """Every parameter once (tied ones once), as ``model.num_parameters()`` counts."""
        return sum(group.numel for group in self.groups)

    @property
    def image_text(self) -> bool:
        return bool(self.parts)

    def part_of(self, group: ModuleGroup) -> str:
        """The part a group belongs to: the part whose module path is the group's longest prefix (the output head
        and anything else outside the tower and the projector count with the language model)."""
        best, length = LANGUAGE_MODEL, -1
        for part, info in self.parts.items():
            for path in info["paths"]:
                if (group.pattern == path or group.pattern.startswith(path + ".")) and len(path) > length:
                    best, length = part, len(path)
        return best

    def part_params(self, parts) -> int:
        """Parameters of the groups in ``parts`` (every parameter once)."""
        return sum(group.numel for group in self.groups if self.part_of(group) in parts)

    def by_kind(self, *kinds: str) -> list[ModuleGroup]:
        return [group for group in self.groups if group.kind in kinds]

    def in_layer(self, index: int) -> list[ModuleGroup]:
        return [group for group in self.groups if index in group.layers]

    def outside_layers(self) -> list[ModuleGroup]:
        return [group for group in self.groups if not group.layers]

    def relative(self, group: ModuleGroup) -> str:
        """A layer group's path inside its decoder layer, e.g. self_attn.q_proj."""
        prefix = self.layers_path + ".*"
        if group.pattern == prefix:
            return ""
        return group.pattern[len(prefix) + 1:] if group.pattern.startswith(prefix + ".") else group.pattern

    def lora_excluded(self, names) -> list[str]:
        """Those of ``names`` (a model's module paths, under any prefix a wrapper adds) whose group PEFT's LoRA
        cannot run (``ModuleGroup.lora_excluded``): what training's LoRA config excludes."""
        patterns = {group.pattern for group in self.groups if group.lora_excluded}
        return [name for name in names if any(collapse(name) == pattern or collapse(name).endswith("." + pattern)
                                              for pattern in patterns)] if patterns else []

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> "Inventory":
        groups = tuple(ModuleGroup(**group) for group in data.pop("groups"))
        return cls(groups=groups, **data)


def canonical_config(config: dict) -> dict:
    """The config without the keys save_pretrained rewrites on every save (they never change the module tree)."""
    return {key: value for key, value in config.items() if key not in VOLATILE_KEYS and not key.startswith("_")}


def config_key(config: dict) -> str:
    """The inventory key of a config: sha256 of its canonical JSON."""
    text = json.dumps(canonical_config(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def shipped_path(key: str) -> Path:
    return SHIPPED_DIR / f"{key}.json"


_DIGITS = re.compile(r"\.\d+(?=\.|$)")


def collapse(path: str) -> str:
    """A module path with every list index as ``*``: model.layers.3.mlp.experts.7 -> model.layers.*.mlp.experts.*"""
    return _DIGITS.sub(".*", path)
