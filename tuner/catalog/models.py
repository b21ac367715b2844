"""Model architecture facts: a shipped catalog, local config.json files and hub configs (tuner/catalog/hub.py).

The planner needs only the handful of numbers that shape parameters and activations.
They are read from the same keys a model's ``config.json`` uses, so a catalog entry, a
local directory and a cached hub config all go through :func:`facts_from_config`.
Parameter counts are exact for the architectures listed in ``_ARCHITECTURES`` (a test
instantiates every catalog entry on the meta device and compares per module).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

CATALOG_FILE = Path(__file__).with_name("models.json")


class UnknownModelError(ValueError):
    """No architecture facts for a model id; the message says where tuner looked."""


@dataclass(frozen=True)
class Architecture:
    """How a model family lays out its parameters, beyond what config.json states."""

    tie_default: bool = False  # tie_word_embeddings when config.json omits it
    qkv_bias: bool | None = None  # None: follow config.attention_bias
    o_bias: bool | None = None
    norms_per_layer: int = 2  # RMSNorms in each decoder layer
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3, Gemma 3)
    fused_qkv: bool = False  # one qkv_proj Linear (Phi-3)
    fused_gate_up: bool = False  # one gate_up_proj Linear (Phi-3)


_ARCHITECTURES = {
    "llama": Architecture(),
    "mistral": Architecture(),
    "mixtral": Architecture(),
    "qwen2": Architecture(qkv_bias=True, o_bias=False),
    "qwen3": Architecture(qk_norm=True),
    "gemma": Architecture(tie_default=True),
    "gemma2": Architecture(tie_default=True, norms_per_layer=4),
    "gemma3_text": Architecture(tie_default=True, norms_per_layer=4, qk_norm=True),
    "phi3": Architecture(fused_qkv=True, fused_gate_up=True),
}


@dataclass(frozen=True)
class LinearLayer:
    """One linear map inside every decoder layer (``count`` > 1 for MoE experts)."""

    name: str  # qualified inside the layer, e.g. self_attn.q_proj
    in_features: int
    out_features: int
    bias: bool = False
    count: int = 1
    is_nn_linear: bool = True  # MoE router and fused experts are not nn.Linear: bitsandbytes leaves them unquantised
    lora_rank_factor: int = 1  # PEFT doubles the rank of fused MoE gate_up experts (its rank_pattern for gate_up_proj)

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * self.count

    @property
    def params(self) -> int:
        return self.weight_params + (self.out_features * self.count if self.bias else 0)


@dataclass(frozen=True)
class ParamCounts:
    embeddings: int
    attention: int
    mlp: int
    norms: int
    lm_head: int

    @property
    def total(self) -> int:
        return self.embeddings + self.attention + self.mlp + self.norms + self.lm_head

    def as_dict(self) -> dict[str, int]:
        return {"embeddings": self.embeddings, "attention": self.attention, "mlp": self.mlp,
                "norms": self.norms, "lm_head": self.lm_head, "total": self.total}


@dataclass(frozen=True)
class ModelFacts:
    """The numbers of one causal LM that decide its memory."""

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
    num_experts: int = 0  # 0 for dense models
    experts_per_token: int = 0
    max_position_embeddings: int | None = None
    source: str = "catalog"
    notes: tuple[str, ...] = ()
    architecture: Architecture = field(default_factory=Architecture, repr=False)
    attention_bias: bool = False
    mlp_bias: bool = False

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_linears(self) -> tuple[LinearLayer, ...]:
        """The linear maps of one decoder layer, named as in transformers."""
        return _layer_linears(self)

    @property
    def param_counts(self) -> ParamCounts:
        return _param_counts(self)

    @property
    def total_params(self) -> int:
        return self.param_counts.total

    def lora_params(self, r: int, target_modules: list[str] | str) -> int:
        """Exact LoRA parameter count: r x (in + out) for every targeted nn.Linear in every layer.

        ``all-linear`` follows PEFT: every linear map except the output head, including a MoE's router and
        fused experts (PEFT adapts those 3-D parameters with rank r x experts).
        """
        return sum(r * lin.lora_rank_factor * (lin.in_features + lin.out_features) * lin.count * self.num_layers
                   for lin in self.lora_targets(target_modules))

    def lora_targets(self, target_modules: list[str] | str) -> list[LinearLayer]:
        if target_modules == "all-linear":
            return list(self.layer_linears())
        linears = [lin for lin in self.layer_linears() if lin.is_nn_linear]
        wanted = [target_modules] if isinstance(target_modules, str) else list(target_modules)
        return [lin for lin in linears
                if any(lin.name == t or lin.name.endswith("." + t) or lin.name.split(".")[-1] == t for t in wanted)]

    def quantizable_params(self) -> int:
        """Weights bitsandbytes quantises: nn.Linear weights inside the layers (not biases, not lm_head)."""
        return sum(lin.weight_params for lin in self.layer_linears() if lin.is_nn_linear) * self.num_layers

    def as_dict(self) -> dict:
        return {
            "name": self.name, "model_type": self.model_type, "source": self.source,
            "hidden_size": self.hidden_size, "num_layers": self.num_layers, "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size, "tie_word_embeddings": self.tie_word_embeddings,
            "num_experts": self.num_experts, "experts_per_token": self.experts_per_token,
            "max_position_embeddings": self.max_position_embeddings, "params": self.param_counts.as_dict(),
            "notes": list(self.notes),
        }


@lru_cache(maxsize=256)
def _layer_linears(facts: ModelFacts) -> tuple[LinearLayer, ...]:
    arch, h, inter = facts.architecture, facts.hidden_size, facts.intermediate_size
    qkv_bias = facts.attention_bias if arch.qkv_bias is None else arch.qkv_bias
    o_bias = facts.attention_bias if arch.o_bias is None else arch.o_bias
    if arch.fused_qkv:
        attention = [LinearLayer("self_attn.qkv_proj", h, facts.q_dim + 2 * facts.kv_dim, qkv_bias)]
    else:
        attention = [LinearLayer("self_attn.q_proj", h, facts.q_dim, qkv_bias),
                     LinearLayer("self_attn.k_proj", h, facts.kv_dim, qkv_bias),
                     LinearLayer("self_attn.v_proj", h, facts.kv_dim, qkv_bias)]
    attention.append(LinearLayer("self_attn.o_proj", facts.q_dim, h, o_bias))
    if facts.is_moe:
        # transformers v5 fuses the experts into 3-D parameters and the router into a plain parameter
        mlp = [LinearLayer("mlp.gate", h, facts.num_experts, is_nn_linear=False),
               LinearLayer("mlp.experts.gate_up_proj", h, 2 * inter, count=facts.num_experts, is_nn_linear=False,
                           lora_rank_factor=2),
               LinearLayer("mlp.experts.down_proj", inter, h, count=facts.num_experts, is_nn_linear=False)]
    elif arch.fused_gate_up:
        mlp = [LinearLayer("mlp.gate_up_proj", h, 2 * inter, facts.mlp_bias),
               LinearLayer("mlp.down_proj", inter, h, facts.mlp_bias)]
    else:
        mlp = [LinearLayer("mlp.gate_proj", h, inter, facts.mlp_bias),
               LinearLayer("mlp.up_proj", h, inter, facts.mlp_bias),
               LinearLayer("mlp.down_proj", inter, h, facts.mlp_bias)]
    return tuple(attention + mlp)


@lru_cache(maxsize=256)
def _param_counts(facts: ModelFacts) -> ParamCounts:
    linears = facts.layer_linears()
    qk_norm = 2 * facts.head_dim if facts.architecture.qk_norm else 0
    attention = sum(lin.params for lin in linears if lin.name.startswith("self_attn.")) + qk_norm
    mlp = sum(lin.params for lin in linears if lin.name.startswith("mlp."))
    embeddings = facts.vocab_size * facts.hidden_size
    return ParamCounts(
        embeddings=embeddings,
        attention=attention * facts.num_layers,
        mlp=mlp * facts.num_layers,
        norms=(facts.architecture.norms_per_layer * facts.num_layers + 1) * facts.hidden_size,
        lm_head=0 if facts.tie_word_embeddings else embeddings,
    )


def facts_from_config(config: dict, name: str, source: str) -> ModelFacts:
    """Architecture facts from a config.json mapping (multimodal configs: their text_config)."""
    if "text_config" in config and "hidden_size" not in config:
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", config.get("model_type"))}
    model_type = str(config.get("model_type") or "llama")
    notes = []
    arch = _ARCHITECTURES.get(model_type)
    if arch is None:
        arch = Architecture()
        notes.append(f"model_type {model_type!r} is not modelled exactly; parameters are estimated as a Llama-shaped decoder")
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        facts = ModelFacts(
            name=name,
            model_type=model_type,
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", arch.tie_default)),
            num_experts=int(config.get("num_local_experts") or config.get("num_experts") or 0),
            experts_per_token=int(config.get("num_experts_per_tok") or 0),
            max_position_embeddings=config.get("max_position_embeddings"),
            source=source,
            notes=tuple(notes),
            architecture=arch,
            attention_bias=bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UnknownModelError(f"{name}: {source} lacks a usable {exc} entry; tuner reads hidden_size, "
                                "num_hidden_layers, num_attention_heads, intermediate_size and vocab_size from it.") from None
    return facts


@lru_cache(maxsize=1)
def _catalog() -> dict[str, dict]:
    data = json.loads(CATALOG_FILE.read_text())
    data.pop("_comment", None)
    return data


def catalog_ids() -> list[str]:
    return list(_catalog())


def _catalog_key(model_id: str) -> str | None:
    """Match a hub id to the catalog, ignoring case, the org and instruct/chat suffixes of the same architecture."""
    entries = {key.lower(): key for key in _catalog()}
    short = {key.split("/")[-1].lower(): key for key in _catalog()}
    wanted = model_id.strip().lower()
    candidates = [wanted, wanted.split("/")[-1]]
    for suffix in ("-instruct", "-it", "-chat"):
        candidates += [c.removesuffix(suffix) for c in candidates if c.endswith(suffix)]
    candidates += [c.replace("meta-llama-3.1", "llama-3.1").replace("meta-llama-3", "llama-3.1") for c in candidates]
    for candidate in candidates:
        if candidate in entries:
            return entries[candidate]
        if candidate in short:
            return short[candidate]
    return None


def _demo_config() -> dict:
    """The built demo model's config.json once it is complete, else its recipe (same numbers)."""
    from tuner.build_once import is_built
    from tuner.catalog.demo import DEMO_CONFIG, DEMO_VOCAB_SIZE, demo_model_dir

    if is_built(demo_model_dir()):
        return json.loads((demo_model_dir() / "config.json").read_text())
    return {"model_type": "llama", "vocab_size": DEMO_VOCAB_SIZE, **DEMO_CONFIG}


@lru_cache(maxsize=64)
def model_facts(model_id: str, revision: str | None = None, trust_remote_code: bool = False) -> ModelFacts:
    """Architecture facts for a recipe's ``model.id``: builtin:demo, a local directory, the catalog, or the hub's
    config.json (:mod:`tuner.catalog.hub`: kept under $TUNER_HOME once fetched; offline, the Hugging Face cache).

    Raises :class:`UnknownModelError` naming what was tried (:class:`~tuner.catalog.hub.HubError` when the hub was
    asked and could not answer).
    """
    if model_id.startswith("builtin:"):
        if model_id != "builtin:demo":
            raise UnknownModelError(f"{model_id}: unknown built-in model; the built-in model is builtin:demo.")
        return facts_from_config(_demo_config(), model_id, "builtin demo model")
    path = Path(model_id).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise UnknownModelError(f"{model_id}: the directory has no config.json; point at a saved Hugging Face model.")
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError) as exc:
            raise UnknownModelError(f"{config_file}: cannot read it as JSON: {exc}.") from None
        return facts_from_config(config, model_id, f"{config_file}")
    if model_id.count("/") > 1 or model_id.startswith((".", "/", "~")):  # a path (a hub id is org/name)
        raise UnknownModelError(f"{model_id}: no such directory; point model.id at a folder save_pretrained wrote, "
                                "such as a finished run's final/ or merged/, or train that run first.")
    key = _catalog_key(model_id)
    if key is not None:
        return facts_from_config(_catalog()[key], model_id, f"tuner catalog ({key})")
    from tuner.catalog.hub import hub_config, is_hub_id

    found = hub_config(model_id, revision)  # kept by tuner, else its config.json from the hub (offline: the HF cache)
    if found is not None:
        return facts_from_config(found.config, model_id, found.source)
    why = ("not kept by tuner nor in the local Hugging Face cache, and HF_HUB_OFFLINE is set so the hub was not "
           "asked. Unset HF_HUB_OFFLINE to fetch its config.json" if is_hub_id(model_id) else
           "and not a hub id (org/name). Give the hub id")
    raise UnknownModelError(
        f"{model_id}: no architecture facts: not a local directory, not in tuner's catalog, {why}, point model.id "
        f"at a directory with config.json, or use one of: {', '.join(catalog_ids())}.")


MAX_CONFIG_BYTES = 4 * 2**20  # a config.json is a few KiB
CODE_CONFIGS = ("config.json", "tokenizer_config.json")  # where a model names the classes it ships (auto_map)


def _local_or_cached(model_id: str, revision: str | None, name: str) -> Path | None:
    """``name`` in the local model folder ``model_id``, or in the Hugging Face cache's copy of it; None if neither."""
    try:
        folder = Path(model_id).expanduser()
        if folder.is_dir():
            return folder / name if (folder / name).is_file() else None
    except (OSError, RuntimeError):  # a name too long for the filesystem, ~user of no one
        return None
    if "/" not in model_id:
        return None
    from huggingface_hub import constants  # a few ms; try_to_load_from_cache brings the HTTP client (~0.2 s)

    repo_folder = constants.REPO_ID_SEPARATOR.join(["models", *model_id.split("/")])  # its repo_folder_name
    if not (Path(constants.HF_HUB_CACHE) / repo_folder).is_dir():
        return None  # nothing of this model is cached: no need to load the cache reader
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_id, name, revision=revision)
    except Exception:  # not a valid hub id: nothing cached under it
        return None
    return Path(cached) if isinstance(cached, str) else None


def custom_code(model_id: str, revision: str | None = None) -> list[str]:
    """The classes a model ships as Python code (``auto_map`` in its config.json or tokenizer_config.json), read
    from a local folder or the Hugging Face cache without running anything; empty when there are none (or the
    model is not on this machine yet)."""
    from tuner.fileio import read_limited

    if model_id.startswith("builtin:"):
        return []
    found: set[str] = set()
    for name in CODE_CONFIGS:
        path = _local_or_cached(model_id, revision, name)
        try:
            config = json.loads(read_limited(path, MAX_CONFIG_BYTES, pipes=False)) if path else None
        except (OSError, ValueError, RecursionError):
            continue  # unreadable here; loading it reports that in its own words
        auto_map = config.get("auto_map") if isinstance(config, dict) else None
        for value in (auto_map.values() if isinstance(auto_map, dict) else ()):
            found.update(ref for ref in (value if isinstance(value, list) else [value]) if isinstance(ref, str) and ref)
    return sorted(found)
