"""A trained vision tower or projector on image rows: what autograd saves of them for the backward, per image, for
the tower kinds :mod:`tuner.planner.tower` models.

What each op saves was read tensor by tensor (``torch.autograd.graph.saved_tensors_hooks`` on tiny towers, fp32,
CPU kernels) and the sums are held to MemTracker traces of the whole step (tests/test_tower_backward.py,
docs/memory.md "Vision tower").  Per encoder layer over its ``N = images x patches`` positions, in the activations'
bytes ``a`` (norm statistics fp32):

* **SigLIP / CLIP layer** (LayerNorm, q/k/v, out_proj, fc1, activation, fc2): each LayerNorm its input and its mean
  and rstd; the attention core sdpa's q, k, v, output (``out_proj`` reads the output itself) and log-sum-exp
  (``N heads`` fp32), eager's q, k, v, the fp32 probabilities (``images x heads x P^2``) and out_proj's contiguous
  input; the activation its input (quick_gelu also its sigmoid); fc1's and the attention projections' input (the
  normalised input, once), fc2's (the activation's output).
* **Qwen2.5-VL block** (RMSNorm, fused qkv, rotary, window attention, proj, gated SiLU MLP): each RMSNorm its fp32
  input, rstd and normalised input; the attention keeps the whole qkv output (v and the rotated q/k's sources are
  views of it), the rotated q and k, sdpa's per-window outputs and log-sum-exp (eager: the probabilities of each
  window, or of the whole image in ``fullatt_block_indexes``), proj's input (the windows' concatenation); the MLP its
  input, SiLU's input, both operands of the product and down_proj's input.  The rotary cos/sin, computed once, are
  shared by every block.

With LoRA on the tower its frozen linears keep nothing; each adapter keeps its dropped-out input and its dropout's
mask (the CPU's dropout multiplies by a float mask, CUDA's keeps a bool one) and its r-wide middle, or without a
dropout its input once per input tensor; RMSNorm's normalised input is not needed (its weight is frozen), and the
first layer's attention input does not require grad (the patch embedding is frozen): its norm keeps nothing and its
q/k/v dropouts no mask.  Under ``memory.gradient_checkpointing`` transformers checkpoints the tower's encoder layers
too (they are ``GradientCheckpointingLayer``): each keeps its input, and one layer is recomputed in the tower's
backward.  Every layer is kept, also those past LLaVA's ``vision_feature_layer`` (-2: the last layer's output is
not read), and SigLIP's pooling head, whose output Gemma 3 does not read: the traces keep their tensors through the
step (the tower's output object outlives ``get_image_features``).

The projector: LLaVA's (linear, GELU, linear) and Qwen's merger (RMSNorm, linear, GELU, linear over 4 merged
patches) keep their linears' inputs and the GELU's input (with LoRA: the GELU's input and the adapters' branches);
Gemma 3's (average pooling, RMSNorm, a matmul) its pooled tokens' norm and matmul input, and the pooling's input
when the tower trains.  A frozen projector on a trained tower
keeps what the backward needs to reach the tower: the GELU's input and the first norm's input.
"""
from __future__ import annotations

from dataclasses import replace

from tuner.catalog.inventory import LANGUAGE_MODEL
from tuner.planner.items import ALWAYS, BACKWARD, STEP, TOWER, TOWER_BACKWARD, Item
from tuner.planner.rank_setup import Setup
from tuner.planner.tower import Tower

VISION_TOWER, PROJECTOR = "vision_tower", "projector"
_STATS = 4  # LayerNorm's mean and rstd, RMSNorm's rstd: fp32 per position
# activation functions whose backward keeps more than their input: quick_gelu is x * sigmoid(1.702 x)
_SAVED_ACTIVATION_COPIES = {"quick_gelu": 2}
# linear maps that read one input tensor (PEFT without a dropout keeps it once for their branches)
_SHARED_INPUTS = (frozenset({"q_proj", "k_proj", "v_proj"}), frozenset({"gate_proj", "up_proj"}))
_ATTENTION_MAPS = frozenset({"q_proj", "k_proj", "v_proj", "qkv", "out_proj", "proj"})


def trains_tower_parts(s: Setup) -> bool:
    """The recipe trains the vision tower or the projector of an image-text model, on image rows."""
    return s.images and bool({VISION_TOWER, PROJECTOR} & set(s.train))


# the tower kinds whose trained backward these terms were read from and traced on; the others tuner.planner.tower
# models (Llama 4, Idefics 3 / SmolVLM, Qwen2-VL, Qwen3-VL) are planned frozen only
TRAINED_KINDS = ("llava", "gemma3", "qwen2_5_vl")


def modelled(s: Setup) -> bool:
    """The recipe trains the tower or the projector of a tower kind these terms cover (:data:`TRAINED_KINDS`)."""
    return trains_tower_parts(s) and s.tower is not None and s.tower.kind in TRAINED_KINDS


def language_model_setup(s: Setup) -> Setup:
    """The setup the language model's activations are planned with: a frozen language model under a trained
    projector or tower (LLaVA's first stage) still runs the backward to reach them, keeping only what its inputs'
    gradients need -- LoRA's terms without adapters."""
    if s.kind == "full" and LANGUAGE_MODEL not in s.train and modelled(s):
        return replace(s, kind="lora")
    return s


def _eager_span(tower: Tower, worst: bool) -> float:
    """Positions one eager attention call spans: the whole image, or for Qwen-VL a window or (in the
    fullatt_block_indexes) the whole image, averaged over the layers unless ``worst``."""
    if tower.kind != "qwen2_5_vl":
        return tower.patches
    if worst and tower.full_attention_layers:
        return tower.patches
    full = tower.full_attention_layers
    return tower.window_span if worst else ((tower.layers - full) * tower.window_span + full * tower.patches) / \
        tower.layers


def _layer_parts(tower: Tower, images: int, a: int, eager: bool, worst: bool = False) -> dict[str, float]:
    """One fully trained encoder layer's saved bytes, by what keeps them (the layer kinds' anatomy above); the
    eager probabilities of the layer with the widest attention when ``worst``, else of the layers' average."""
    n, h, i = images * tower.patches, tower.hidden, tower.intermediate
    hidden, wide = n * h * a, n * i * a
    probabilities = n * tower.heads * _eager_span(tower, worst) * (4 + (a if a != 4 else 0))
    if tower.kind == "qwen2_5_vl":
        if eager:  # each window's (or the whole image's) probabilities, fp32 and their cast for the matmul
            core = 5 * hidden + probabilities
        else:
            core = 6 * hidden + n * tower.heads * _STATS
        return {"norm inputs": 2 * (hidden + n * _STATS), "norm outputs": 2 * hidden, "attention core": core,
                "linear inputs": 3 * hidden, "activation": 3 * wide, "wide linear input": wide}
    if eager:
        core, out_proj = 3 * hidden + probabilities, hidden
    else:
        core, out_proj = 4 * hidden + n * tower.heads * _STATS, 0
    return {"norm inputs": 2 * (hidden + 2 * n * _STATS), "norm outputs": 0, "attention core": core,
            "linear inputs": 2 * hidden + out_proj,
            "activation": _SAVED_ACTIVATION_COPIES.get(tower.activation, 1) * wide, "wide linear input": wide}


def _adapted_inputs(s: Setup) -> list[tuple[str, int]]:
    """(leaf name, input width) of each linear map of one encoder layer that carries a LoRA adapter."""
    found = []
    for group in s.model.lora_groups(s.lora_targets, s.lora_parameters, (VISION_TOWER,)):
        if "*" in group.pattern and "weight" in group.params and len(group.params["weight"]) == 2:
            found += [(group.leaf, group.params["weight"][1])] * max(1, group.instances // s.tower.layers)
    return found


def _lora_branches(s: Setup, n: int, first: bool, mlp_only: bool = False) -> float:
    """The adapters' saved tensors in one layer (``mlp_only``: the MLP's): per adapted map its dropped-out input in
    the adapter's compute dtype and the dropout's mask (none for the first layer's q/k/v, whose input needs no
    gradient), and the r-wide input of lora_B; without a dropout, lora_A keeps its input itself, once per input
    tensor."""
    compute = 2 if s.mixed else 4
    adapted = [(leaf, width) for leaf, width in _adapted_inputs(s) if not (mlp_only and leaf in _ATTENTION_MAPS)]
    if s.lora_dropout > 0:
        mask = 1 if s.on_gpu else 4
        inputs = sum(width * (compute + (0 if first and leaf in _ATTENTION_MAPS - {"out_proj", "proj"} else mask))
                     for leaf, width in adapted)
    else:
        distinct = {next((min(group) for group in _SHARED_INPUTS if leaf in group), leaf): width
                    for leaf, width in adapted}
        inputs = sum(distinct.values()) * compute
    return n * (inputs + len(adapted) * s.lora_r * compute)


def _layer_bytes(s: Setup, first: bool, worst: bool = False) -> float:
    """What one encoder layer of the trained tower saves (full, or LoRA on it)."""
    tower = s.tower
    parts = _layer_parts(tower, s.batch, s.act_bytes, s.eager, worst)
    if s.kind == "full":
        return sum(parts.values())
    n = s.batch * tower.patches
    first_norm = parts["norm inputs"] / 2 if first else 0.0  # the first norm's input needs no gradient there
    return parts["norm inputs"] - first_norm + parts["attention core"] + parts["activation"] + \
        _lora_branches(s, n, first)


def _clip(s: Setup) -> bool:
    return (s.model.inventory.source_config.get("vision_config") or {}).get("model_type") == "clip_vision_model"


def _outside_layers_bytes(s: Setup) -> float:
    """The trained tower's saved tensors outside its encoder layers: Qwen's rotary cos/sin (fp32, shared by every
    block); CLIP's pre-layer norm (its input needs a gradient only when the patch embedding trains: in full);
    SigLIP's post-layer norm over every patch -- each norm's input and statistics -- and SigLIP's attention pooling
    head (``vision_use_head``, its config's default; Gemma 3's checkpoints turn it off): neither model reads its
    output, but the tower's output keeps its graph alive through the step, with its key/value input (full only), the
    keys and values and one query's probabilities per image."""
    tower, n, a = s.tower, s.batch * s.tower.patches, s.act_bytes
    if tower.kind == "qwen2_5_vl":
        return 2 * n * (tower.hidden // tower.heads) * 4
    norm = n * (tower.hidden * a + 2 * _STATS)
    vision = s.model.inventory.source_config.get("vision_config") or {}
    if _clip(s):
        return norm if s.kind == "full" else 0.0
    head = ((3 if s.kind == "full" else 2) * n * tower.hidden * a + n * tower.heads * 4) \
        if vision.get("vision_use_head", True) else 0.0
    return norm + head


def _projector_lora_bytes(s: Setup, rows: int) -> float:
    """LoRA on the projector's linear maps (Qwen's merger: over the merged tokens): each adapter's dropped-out
    input and mask, and lora_B's r-wide input, as in the tower's layers."""
    compute, mask = (2 if s.mixed else 4), (0 if s.lora_dropout == 0 else 1 if s.on_gpu else 4)
    groups = s.model.lora_groups(s.lora_targets, s.lora_parameters, (PROJECTOR,))
    widths = [group.params["weight"][1] for group in groups if len(group.params.get("weight", ())) == 2]
    return rows * sum(width * (compute + mask) + s.lora_r * compute for width in widths)


def _projector_bytes(s: Setup) -> float:
    """The projector's saved tensors: trained (its linears' inputs) or frozen on a trained tower (what the
    backward needs to reach the tower)."""
    tower, a = s.tower, s.act_bytes
    n, tokens = s.batch * tower.patches, s.batch * tower.tokens
    text = s.model.hidden_size
    tower_trains = VISION_TOWER in s.train
    trained = PROJECTOR in s.train
    if tower.kind == "qwen2_5_vl":  # ln_q over the patches, then 4 merged patches a token: N x h each
        hidden = n * tower.hidden * a
        if trained and s.kind == "full":
            return 4 * hidden + (hidden + n * _STATS if tower_trains else 0)
        return 2 * hidden + n * _STATS + (_projector_lora_bytes(s, tokens) if trained else 0)
    if tower.kind == "gemma3":
        pooled = tokens * tower.hidden * a
        pooling = n * tower.hidden * a if tower_trains else 0.0
        if trained:
            return pooling + 2 * pooled + (pooled + tokens * _STATS if tower_trains else 0)
        return pooling + pooled + tokens * _STATS
    # llava: linear_1 over the selected patches, GELU, linear_2
    if trained and s.kind == "full":
        return tokens * (tower.hidden + 2 * text) * a
    return tokens * text * a + (_projector_lora_bytes(s, tokens) if trained else 0)


def _layer_gradient_bytes(s: Setup) -> float:
    """The gradients of one encoder layer's intermediates while its backward runs, beside what it saved: its
    output's gradient, and the larger of the MLP's (the intermediate's and the activation's) and eager attention's
    (the probabilities' and the scores', 4 + a per element of the widest layer's; Qwen-VL's one image or window at
    a time), the latter once the MLP's and the second norm's saved tensors are freed (their backward ran first)."""
    tower, a = s.tower, s.act_bytes
    n = s.batch * tower.patches
    mlp = 2 * n * tower.intermediate * a
    attention = 0.0
    if s.eager:
        parts = _layer_parts(tower, s.batch, a, s.eager, worst=True)
        after_mixer = parts["norm inputs"] / 2 + parts["activation"] + (
            parts["norm outputs"] / 2 + parts["wide linear input"] + n * tower.hidden * a if s.kind == "full" else
            _lora_branches(s, n, first=False, mlp_only=True))
        span = _eager_span(tower, worst=True)
        # Qwen-VL runs its attention one image or window at a time, and so its backward; SigLIP/CLIP the batch
        chunk = tower.heads * span * span if tower.kind == "qwen2_5_vl" else n * tower.heads * span
        attention = chunk * (4 + a) - after_mixer
    return n * tower.hidden * a + max(mlp, attention)


def tower_backward_items(s: Setup, gpu_items: list[Item]) -> list[Item]:
    """What a trained tower and/or projector keep for the backward over one micro-batch's images, live from their
    forward (the first of the step) until their backward, the last of the step; and that backward's own moment:
    the gradients made before it (every one the optimizer step holds: ``gpu_items``' gradients), a checkpointed
    layer recomputed and one layer's intermediate gradients.  [] where neither trains or the tower is not
    modelled."""
    if not modelled(s):
        return []
    tower = s.tower
    phase = (TOWER,) + BACKWARD + (TOWER_BACKWARD,)
    label = f"({s.batch} x {tower.patches} patches)"
    items = []
    if VISION_TOWER in s.train:
        layers = tower.layers
        if s.checkpointing:
            saved = layers * s.batch * tower.patches * tower.hidden * s.act_bytes
            name = f"vision tower: checkpointed inputs of its {layers} encoder layers {label}"
            items.append(Item("vision tower: one encoder layer recomputed in its backward", "activations",
                              _layer_bytes(s, first=False, worst=True), TOWER_BACKWARD, source="tower-backward"))
        else:
            saved = _layer_bytes(s, first=True) + (layers - 1) * _layer_bytes(s, first=False)
            how = "in full" if s.kind == "full" else "with LoRA"
            name = f"vision tower: saved activations of its {layers} encoder layers, trained {how} {label}"
        items.append(Item(name, "activations", saved, phase, source="tower-backward"))
        # the tower's backward runs after the post-layer norm's, the pooling head's and the projector's: only what
        # comes before the layers (Qwen's rotary tables, CLIP's pre-layer norm) is still kept then
        before = tower.kind == "qwen2_5_vl" or _clip(s)
        items.append(Item("vision tower: saved outside its layers (norms, pooling head, rotary tables)", "activations",
                          _outside_layers_bytes(s), phase if before else phase[:-1], source="tower-backward"))
        items.append(Item("vision tower: gradients of one encoder layer's intermediates", "activations",
                          _layer_gradient_bytes(s), TOWER_BACKWARD, source="tower-backward"))
    items.append(Item(f"projector: saved activations ({'trained' if PROJECTOR in s.train else 'frozen'})",
                      "activations", _projector_bytes(s), phase[:-1], source="tower-backward"))
    items += [Item(f"{item.name}, made before the tower's backward", item.category, item.bytes, TOWER_BACKWARD,
                   item.source) for item in gpu_items
              if item.category == "gradients" and item.phase != ALWAYS and item.live_in(STEP)]
    return items
