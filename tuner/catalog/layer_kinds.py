"""What each decoder layer of a model is, read from its inventory: its token mixer, its MLP and their sizes.

The planner has activation terms for a handful of layer kinds; this module recognises them by the parameters a
layer's parts hold (their leaf names and shapes, the module tree transformers built), never by the model's name:

- mixers: ``attention`` (q/k/v/o projections, optional q/k norms, attention sinks, a gated output as in Qwen3-Next),
  ``mla`` (DeepSeek's multi-head latent attention: low-rank q and kv projections), ``gated_delta_net`` (Qwen3-Next and
  Qwen3.5's linear attention: in-projections, a causal conv1d, the decay parameters, a gated norm);
  a Mamba / Mamba-2 state-space mixer (Jamba, Bamba, Granite 4.0, Nemotron-H, Falcon-H1) is recognised and named as
  not modelled;
- MLPs: ``dense`` (SwiGLU: gate, up, down, or a fused gate_up) and ``moe`` (a router, fused 3-D experts, optional
  shared experts and their gate).

Any other part of a layer (or of the model outside its layers) is named in :attr:`LayerKind.unmodelled`, and the
planner gives no verdict on a model that has one: it cannot judge what it does not model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tuner.catalog.inventory import Inventory, ModuleGroup

ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention")  # layer_types an attention mixer takes
LINEAR_ATTENTION_TYPES = ("linear_attention",)
SHARED_EXPERT_NAMES = ("shared_expert", "shared_experts", "shared_mlp")
# transformers' expert classes that run every token through every expert, scaled by its router score (no dispatch)
ALL_EXPERTS_CLASSES = ("Llama4TextExperts",)
_ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
# transformers' names of a norm on the MLP's output (Gemma 2/3, OLMo 2, GLM 4, ...): its backward runs first
_NORMS_AFTER_MLP = ("post_feedforward_layernorm", "post_mlp_layernorm", "post_ffn_norm")
_ATTENTION_OPTIONAL = {"q_norm", "k_norm"}
_MLA_KV = {"kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"}
_MLA_Q = ({"q_a_proj", "q_a_layernorm", "q_b_proj"}, {"q_proj"})
_GDN = ({"in_proj_qkvz", "in_proj_ba", "conv1d", "norm", "out_proj"},
        {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "norm", "out_proj"})
_DENSE = ({"gate_proj", "up_proj", "down_proj"}, {"gate_up_proj", "down_proj"})


@dataclass(frozen=True)
class LinearLayer:
    """One linear map inside a decoder layer (``count`` > 1 for experts: one map per expert)."""

    name: str  # inside the layer, e.g. self_attn.q_proj or mlp.experts.gate_up_proj
    in_features: int
    out_features: int
    bias: bool = False
    count: int = 1
    is_nn_linear: bool = True  # what bitsandbytes and target_modules see; fused experts and routers are not
    quantized: bool = False  # bitsandbytes replaces it (transformers' rule, recorded in the inventory)

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * self.count


@dataclass(frozen=True)
class LayerKind:
    """The decoder layers that share one structure."""

    layers: tuple[int, ...]
    mixer: str  # attention, mla, gated_delta_net, or "" when the layer's mixer is not modelled
    attention_type: str  # the layer_types entry (full_attention when the model has none)
    mlp: str  # dense, moe, or "" when not modelled
    dims: dict = field(default_factory=dict, compare=False, hash=False)  # what the activation terms read
    linears: tuple[LinearLayer, ...] = ()
    norms: tuple[int, ...] = ()  # widths of the norms on the residual stream (input, post-attention, ...)
    params: int = 0  # parameters of one layer of this kind
    mixer_params: int = 0
    mlp_params: int = 0
    norm_params: int = 0
    unmodelled: tuple[str, ...] = ()  # parts no activation term covers, e.g. "mamba (BambaMixer, a Mamba-2 mixer: ...)"

    @property
    def count(self) -> int:
        return len(self.layers)

    @property
    def modelled(self) -> bool:
        return not self.unmodelled

    def describe(self) -> str:
        mixer = {"attention": "attention", "mla": "latent attention (MLA)",
                 "gated_delta_net": "gated delta net"}.get(self.mixer, "?")
        if self.mixer == "attention" and self.attention_type != "full_attention":
            mixer = self.attention_type.replace("_", " ")
        mlp = {"dense": "dense MLP", "moe": "MoE"}.get(self.mlp, "?")
        return f"{self.count} x {mixer} + {mlp}"


def _child(relative: str) -> str:
    return relative.split(".", 1)[0]


def _inside(relative: str, child: str) -> str:
    return relative[len(child) + 1:] if relative.startswith(child + ".") else ""


def _shape(group: ModuleGroup, name: str = "weight") -> list[int]:
    return group.params.get(name) or []


def _linear(relative: str, group: ModuleGroup) -> LinearLayer | None:
    """The linear map a group holds, by its weight's shape (fused experts: each 3-D tensor is one map per expert)."""
    weight = _shape(group)
    if group.kind in ("linear", "router", "output") and len(weight) == 2:
        out_features, in_features = weight
        if group.module == "Conv1D":  # GPT-2's Conv1D stores (in, out)
            in_features, out_features = weight
        return LinearLayer(relative, in_features, out_features, "bias" in group.params, group.per_layer_instances,
                           group.kind == "linear" and group.module in ("Linear", "Conv1D"), group.quantized)
    return None


def _expert_linears(relative: str, group: ModuleGroup, hidden: int) -> list[LinearLayer]:
    """Fused experts' maps: gate_up_proj (E, 2I, h) and down_proj (E, h, I), or their transposes (E, h, 2I) and
    (E, I, h) as Llama 4 and gpt-oss store them; the side that equals the hidden size tells which."""
    maps = []
    for name, shape in group.params.items():
        if len(shape) != 3 or name.endswith("_bias"):
            continue
        experts, rows, cols = shape
        if name.startswith("down"):
            in_features, out_features = (cols, rows) if rows == hidden else (rows, cols)
        else:
            in_features, out_features = (cols, rows) if cols == hidden else (rows, cols)
        maps.append(LinearLayer(f"{relative}.{name}", in_features, out_features, f"{name}_bias" in group.params,
                                experts * group.per_layer_instances, is_nn_linear=False))
    return maps


def classify(inventory: Inventory, hidden: int, heads: int, config: dict) -> tuple[tuple[LayerKind, ...], tuple[str, ...]]:
    """The layer kinds of a model, and the parts outside its decoder layers no term covers."""
    by_layer: dict[int, list[tuple[str, ModuleGroup]]] = {}
    for group in inventory.groups:
        for index in group.layers:
            by_layer.setdefault(index, []).append((inventory.relative(group), group))
    kinds: dict[tuple, list[int]] = {}
    described: dict[tuple, LayerKind] = {}
    for index in range(inventory.num_layers):
        layer_type = inventory.layer_types[index] if index < len(inventory.layer_types) else "full_attention"
        kind = _layer_kind(by_layer.get(index, []), layer_type, hidden, heads, config)
        key = (kind.mixer, kind.attention_type, kind.mlp, tuple(sorted(kind.dims.items(), key=str)), kind.linears,
               kind.norms, kind.params, kind.unmodelled)
        kinds.setdefault(key, []).append(index)
        described.setdefault(key, kind)
    layer_kinds = tuple(LayerKind(tuple(indices), **{k: v for k, v in vars(described[key]).items() if k != "layers"})
                        for key, indices in kinds.items())
    outside = tuple(f"{group.pattern} ({group.module})" for group in inventory.outside_layers()
                    if group.kind not in ("embedding", "output", "norm"))
    return layer_kinds, outside


def _layer_kind(members: list[tuple[str, ModuleGroup]], layer_type: str, hidden: int, heads: int,
                config: dict) -> LayerKind:
    children: dict[str, list[tuple[str, ModuleGroup]]] = {}
    unmodelled: list[str] = []
    norms: list[int] = []
    norm_params = 0
    norm_after_mlp = False
    for relative, group in members:
        if relative == "":
            if group.params:  # the decoder layer's own parameters (scalars, gates)
                unmodelled.append(f"the layer's own parameters {sorted(group.params)} ({group.module})")
            continue
        if "." not in relative and group.kind == "norm":
            norms.append(_shape(group)[0] if _shape(group) else hidden)
            norm_after_mlp = norm_after_mlp or relative.startswith(_NORMS_AFTER_MLP)
            norm_params += group.own_numel * group.per_layer_instances
            continue
        children.setdefault(_child(relative), []).append((relative, group))
    mixer, mlp, dims, linears = "", "", {}, []
    mixer_params = mlp_params = 0
    for child, parts in children.items():
        inner = {_inside(relative, child): group for relative, group in parts}
        block = next((group for relative, group in parts if relative == child), None)
        params = sum(group.own_numel * group.per_layer_instances for _, group in parts)
        found = (_attention(child, inner, block, heads, layer_type) or _mla(child, inner, block, config) or
                 _gated_delta_net(child, inner, block, layer_type))
        if found and not mixer:
            mixer, found_dims = found
            dims.update(found_dims)
            mixer_params = params
        elif (moe := _moe(child, inner, block, hidden, config)) and not mlp:
            mlp = "moe"
            dims.update(moe)
            mlp_params = params
        elif (dense := _dense(inner, block)) and not mlp:
            mlp = "dense"
            dims.update(dense)
            mlp_params = params
        else:
            cls = block.module if block else parts[0][1].module
            ssm = _state_space(inner, block)
            unmodelled.append(f"{child} ({cls}, a {ssm} mixer: not modelled)" if ssm else f"{child} ({cls})")
            continue
        for relative, group in parts:
            if group.kind == "experts":
                linears += _expert_linears(relative, group, hidden)
            elif (linear := _linear(relative, group)) is not None:
                linears.append(linear)
    dims["norm_after_mlp"] = norm_after_mlp
    if not mixer and not unmodelled:
        unmodelled.append("no token mixer")
    if not mlp and not unmodelled:
        unmodelled.append("no MLP")
    return LayerKind(layers=(), mixer=mixer, attention_type=layer_type, mlp=mlp, dims=dims, linears=tuple(linears),
                     norms=tuple(norms), params=sum(group.own_numel * group.per_layer_instances for _, group in members),
                     mixer_params=mixer_params, mlp_params=mlp_params, norm_params=norm_params,
                     unmodelled=tuple(u for u in unmodelled if u))


def _state_space(inner: dict[str, ModuleGroup], block: ModuleGroup | None) -> str:
    """"Mamba-2" or "Mamba" for a selective state-space mixer (the decay A_log and skip D of its own, a causal
    conv1d, in/out projections; Mamba-2 has a per-head dt_bias where Mamba-1 projects dt), else "".  The planner has
    no terms for its state and conv caches or its scan's activations, so it is named, not planned."""
    if not {"A_log", "D"} <= _own(block) or not {"conv1d", "in_proj", "out_proj"} <= set(inner):
        return ""
    return "Mamba-2" if "dt_bias" in _own(block) and "dt_proj" not in inner else "Mamba"


def _own(block: ModuleGroup | None) -> set[str]:
    return set(block.params) if block is not None else set()


def _attention(child: str, inner: dict[str, ModuleGroup], block, heads: int, layer_type: str):
    leaves = set(inner) - {""}
    fused = {"qkv_proj", "o_proj"} <= leaves
    if not (_ATTENTION <= leaves or fused) or leaves - _ATTENTION - _ATTENTION_OPTIONAL - {"qkv_proj"}:
        return None
    if _own(block) - {"sinks"} or layer_type not in ATTENTION_TYPES:
        return None
    attrs = block.attrs if block is not None else {}
    q_out = _shape(inner["qkv_proj" if fused else "q_proj"])[0]
    o_in = _shape(inner["o_proj"])[1]
    head_dim = int(attrs.get("head_dim") or o_in // heads)
    heads = o_in // head_dim
    if fused:
        kv_width = (q_out - o_in) // 2
        gate = False
    else:
        kv_width = _shape(inner["k_proj"])[0]
        gate = q_out == 2 * o_in  # Qwen3-Next / Qwen3.5: q_proj also makes a per-head output gate
        if q_out not in (o_in, 2 * o_in):
            return None
    q_norm = inner.get("q_norm")
    dims = {"heads": heads, "kv_heads": max(kv_width // head_dim, 1), "head_dim": head_dim, "q_width": o_in,
            "kv_width": kv_width, "output_gate": gate, "sinks": "sinks" in _own(block),
            "qk_norm": 0 if q_norm is None else _shape(q_norm)[0],
            "window": int(attrs.get("sliding_window") or 0) if layer_type == "sliding_attention" else 0,
            "mixer_path": child, "fused_qkv": fused}
    return "attention", dims


def _mla(child: str, inner: dict[str, ModuleGroup], block, config: dict):
    leaves = set(inner) - {""}
    q_parts = next((q for q in _MLA_Q if q <= leaves), None)
    if q_parts is None or not _MLA_KV <= leaves or leaves - _MLA_KV - q_parts or _own(block):
        return None
    attrs = block.attrs if block is not None else {}
    kv_rank = _shape(inner["kv_a_layernorm"])[0]
    rope = _shape(inner["kv_a_proj_with_mqa"])[0] - kv_rank
    heads = int(attrs.get("num_heads") or config.get("num_attention_heads") or 1)
    q_out = _shape(inner["q_b_proj" if "q_b_proj" in inner else "q_proj"])[0]
    qk_dim = q_out // heads
    nope = qk_dim - rope
    v_dim = _shape(inner["kv_b_proj"])[0] // heads - nope
    q_rank = _shape(inner["q_a_layernorm"])[0] if "q_a_layernorm" in inner else 0
    return "mla", {"heads": heads, "q_rank": q_rank, "kv_rank": kv_rank, "rope_dim": rope, "nope_dim": nope,
                   "v_dim": v_dim, "head_dim": qk_dim, "kv_heads": heads, "q_width": heads * qk_dim,
                   "kv_width": heads * qk_dim, "mixer_path": child}


def _gated_delta_net(child: str, inner: dict[str, ModuleGroup], block, layer_type: str):
    leaves = set(inner) - {""}
    if not any(leaves == signature for signature in _GDN) or _own(block) != {"dt_bias", "A_log"}:
        return None
    if layer_type not in LINEAR_ATTENTION_TYPES + ("full_attention",):
        return None
    attrs = block.attrs
    try:
        dims = {"k_heads": int(attrs["num_k_heads"]), "v_heads": int(attrs["num_v_heads"]),
                "k_dim": int(attrs["head_k_dim"]), "v_dim": int(attrs["head_v_dim"]),
                "conv_kernel": int(attrs.get("conv_kernel_size") or _shape(inner["conv1d"])[-1]),
                "conv_width": _shape(inner["conv1d"])[0], "fused_projections": "in_proj_qkvz" in leaves,
                "mixer_path": child}
    except (KeyError, TypeError, ValueError):
        return None
    return "gated_delta_net", dims


def _dense(inner: dict[str, ModuleGroup], block) -> dict | None:
    leaves = set(inner) - {""}
    signature = next((s for s in _DENSE if leaves == s), None)
    if signature is None or _own(block):
        return None
    down = _shape(inner["down_proj"])
    return {"intermediate": down[1], "fused_gate_up": "gate_up_proj" in leaves}


def _moe(child: str, inner: dict[str, ModuleGroup], block, hidden: int, config: dict) -> dict | None:
    routers = [name for name, group in inner.items() if group.kind == "router" and "." not in name]
    experts = [name for name, group in inner.items() if group.kind == "experts" and "." not in name]
    if len(routers) != 1 or len(experts) != 1 or _own(block):
        return None
    router, group = inner[routers[0]], inner[experts[0]]
    params = {name for name in group.params}
    weights = {name for name in params if not name.endswith("_bias")}
    if weights not in ({"gate_up_proj", "down_proj"},) or params - weights - {"gate_up_proj_bias", "down_proj_bias"}:
        return None
    if set(router.params) - {"weight", "bias", "e_score_correction_bias"}:
        return None
    shared_width, shared_gate = 0, False
    for name in set(inner) - {"", routers[0], experts[0]}:
        head = name.split(".", 1)[0]
        if head in SHARED_EXPERT_NAMES or head == routers[0]:  # shared experts; the router's own statistics
            continue
        if name == "shared_expert_gate" and _shape(inner[name]) == [1, hidden]:
            shared_gate = True
            continue
        return None
    for head in SHARED_EXPERT_NAMES:
        shared = {name[len(head) + 1:]: g for name, g in inner.items() if name.startswith(head + ".")}
        if shared:
            dense = _dense(shared, inner.get(head))
            if dense is None:
                return None
            shared_width += dense["intermediate"]
    experts_count = _shape(group, "gate_up_proj")[0]
    down = _shape(group, "down_proj")
    width = down[2] if down[1] == hidden else down[1]
    top_k = router.attrs.get("top_k") or (block.attrs.get("top_k") if block else None) or \
        config.get("num_experts_per_tok") or config.get("moe_topk")
    if not isinstance(top_k, int) or not 0 < top_k <= experts_count:
        return None
    if "has_gate" in group.attrs:  # @use_experts_implementation: grouped_mm over the routed tokens
        if not group.attrs["has_gate"] or group.attrs.get("has_post_expert_norm"):
            return None
        dispatch = "grouped"
    elif group.module in ALL_EXPERTS_CLASSES:
        dispatch = "all_experts"
    else:
        return None  # an experts module whose dispatch tuner does not know
    return {"experts": experts_count, "top_k": top_k, "expert_width": width, "shared_width": shared_width,
            "shared_gate": shared_gate, "expert_bias": "gate_up_proj_bias" in params, "dispatch": dispatch,
            "clamped_gate": "limit" in group.attrs, "router_path": routers[0], "mlp_path": child}
