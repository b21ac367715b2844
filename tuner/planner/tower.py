"""The vision tower on a micro-batch's images: how many image tokens each image puts in the language model's
sequence, and what a frozen tower's forward holds while it runs.

Image tokens, as transformers 5.24's processors count them (one image a row, no tiling):

* LLaVA (``LlavaProcessor._get_num_multimodal_tokens``): ``(image_size // patch_size)**2`` plus the tower's class
  token (``num_additional_image_tokens``: CLIP's one, SigLIP's none), less one under
  ``vision_feature_select_strategy: default``, which drops it (``LlavaModel.get_image_features``: ``[:, 1:]``).
* Gemma 3 (``Gemma3Processor``: ``image_seq_length = mm_tokens_per_image``): the SigLIP patches average-pooled
  by ``Gemma3MultiModalProjector`` to ``mm_tokens_per_image`` (pan-and-scan off, its default).
* Qwen2.5-VL (``Qwen2VLImageProcessor.smart_resize``): the image resized to multiples of ``patch_size *
  spatial_merge_size`` within ``max_pixels`` (the image processor's default ``28 * 28 * 1280``, or the data's
  ``max_image_pixels`` where smaller), one patch per ``patch_size**2`` pixels, and the merger's ``merge_size**2``
  patches per token.  Planned for a square image of the most pixels allowed: the worst case.

TRL's ``DataCollatorForVisionLanguageModeling`` cuts ``input_ids`` after the processor expanded each image
placeholder, so the image tokens are inside ``max_seq_length``, not added to it; a sequence too short for them fails
in the model ("Image features and image tokens do not match"), which the plan's note says.

The tower's parameters are frozen and nothing it gets requires a gradient, so autograd saves nothing of it: its
forward is a transient moment (:data:`tuner.planner.items.TOWER`) before the language model's, holding the pixel
values, the tower's input and one encoder layer's working set (measured op by op against MemTracker:
tests/test_tower_memory.py, docs/memory.md "Vision tower").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# transformers 5.24's config defaults for what a config.json may leave out (CLIPVisionConfig, SiglipVisionConfig,
# Qwen2_5_VLVisionConfig, Gemma3Config, LlavaConfig)
_DEFAULTS = {
    "clip_vision_model": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                              image_size=224, patch_size=32, hidden_act="quick_gelu", num_channels=3),
    "siglip_vision_model": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                                image_size=224, patch_size=16, hidden_act="gelu_pytorch_tanh", num_channels=3),
    "qwen2_5_vl_vision": dict(hidden_size=3584, intermediate_size=3420, depth=32, num_heads=16, patch_size=14,
                              spatial_merge_size=2, temporal_patch_size=2, window_size=112, in_channels=3,
                              fullatt_block_indexes=[7, 15, 23, 31]),
}
QWEN_MAX_PIXELS = 28 * 28 * 1280  # Qwen2VLImageProcessor's size["longest_edge"]
# live copies of the activation function's input while it runs, per element of the MLP's intermediate width:
# quick_gelu is x * sigmoid(1.702 x) (fc1's output, the sigmoid, the product); one fused op keeps input and output
_ACTIVATION_COPIES = {"quick_gelu": 3}
IMAGE_SOURCES = ("builtin:shapes",)  # built-in data of image rows (data.format auto)


@dataclass(frozen=True)
class Tower:
    """A vision tower the planner models, and the image one row of the recipe's data gives it."""

    kind: str  # llava (a CLIP or SigLIP tower), gemma3 (SigLIP + pooling projector) or qwen2_5_vl
    layers: int
    hidden: int
    intermediate: int
    heads: int
    patches: int  # positions one image's encoder layers run over
    tokens: int  # image tokens one image puts in the language model's sequence
    channels: int
    pixels: int  # pixel values of one image, as the processor hands them over (channels x height x width)
    activation: str = "gelu"
    grid: tuple[int, int] = ()  # Qwen-VL: patches high and wide
    full_attention_span: int = 0  # Qwen-VL: the longest span one eager attention call covers (an image or a window)
    window_span: int = 0  # Qwen-VL: patches one window's attention covers
    full_attention_layers: int = 0  # Qwen-VL: the layers attending over a whole image (fullatt_block_indexes)

    def describe(self) -> str:
        return f"{self.kind} tower: {self.patches} patches an image, {self.tokens} image tokens"


def has_image_data(recipe) -> bool:
    """The recipe's rows carry images: an image format, or built-in image data read as auto."""
    data = recipe.data
    return data.format.startswith("image_") or (data.format == "auto" and data.source in IMAGE_SOURCES)


def _vision(config: dict) -> dict:
    vision = config.get("vision_config") or {}
    return {**_DEFAULTS.get(vision.get("model_type", ""), {}), **vision}


def _llava(config: dict) -> Tower | None:
    vision = _vision(config)
    if vision.get("model_type") not in ("clip_vision_model", "siglip_vision_model"):
        return None
    side = vision["image_size"] // vision["patch_size"]
    patches = side * side + (vision["model_type"] == "clip_vision_model")  # CLIP's class token
    default = config.get("vision_feature_select_strategy", "default") == "default"
    return Tower("llava", vision["num_hidden_layers"], vision["hidden_size"], vision["intermediate_size"],
                 vision["num_attention_heads"], patches, patches - default, vision["num_channels"],
                 vision["num_channels"] * vision["image_size"] ** 2, vision["hidden_act"])


def _gemma3(config: dict) -> Tower | None:
    vision = _vision(config)
    if vision.get("model_type") != "siglip_vision_model":
        return None
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    return Tower("gemma3", vision["num_hidden_layers"], vision["hidden_size"], vision["intermediate_size"],
                 vision["num_attention_heads"], patches, config.get("mm_tokens_per_image", 256),
                 vision["num_channels"], vision["num_channels"] * vision["image_size"] ** 2, vision["hidden_act"])


def _qwen2_5_vl(config: dict, max_image_pixels: int) -> Tower:
    vision = _vision(config)
    factor = vision["patch_size"] * vision["spatial_merge_size"]
    side = math.isqrt(min(QWEN_MAX_PIXELS, max_image_pixels))
    resized = max(factor, round(side / factor) * factor)
    if resized * resized > QWEN_MAX_PIXELS:  # smart_resize: floor instead, to stay within max_pixels
        resized = max(factor, math.floor(side / factor) * factor)
    grid = resized // vision["patch_size"]
    window = (vision["window_size"] // factor) * vision["spatial_merge_size"]  # patches a side of one window
    span = grid * grid if vision["fullatt_block_indexes"] else min(grid, window) ** 2
    width = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    return Tower("qwen2_5_vl", vision["depth"], vision["hidden_size"], vision["intermediate_size"],
                 vision["num_heads"], grid * grid, grid * grid // vision["spatial_merge_size"] ** 2,
                 vision["in_channels"], grid * grid * width, "silu", (grid, grid), span, min(grid, window) ** 2,
                 len(vision["fullatt_block_indexes"]))


def tower_of(inventory, recipe) -> Tower | None:
    """The tower of an image-text model the planner models, for the recipe's images; None for any other."""
    config = inventory.source_config
    kind = config.get("model_type")
    if kind == "llava":
        return _llava(config)
    if kind == "gemma3":
        return _gemma3(config)
    if kind == "qwen2_5_vl":
        return _qwen2_5_vl(config, recipe.data.max_image_pixels)
    return None


def tower_bytes(tower: Tower, images: int, act_bytes: int, eager: bool) -> dict[str, float]:
    """Bytes live at the peak of a frozen tower's forward over ``images`` images, by what holds them: the pixel
    values (fp32, as the image processor makes them), the tower's input (the patch embeddings and the layer's
    input; Qwen-VL: the layer's input, its rotary cos/sin and the patch embedding's copy of the patches), and one encoder layer at its worst step -- attention
    (its norm, q/k/v, the output and its reshaped copy; eager: the scores and their softmax over the longest span
    instead of the copies) or the MLP (the residual sum, its norm, and the intermediate activations)."""
    positions = images * tower.patches
    hidden = positions * tower.hidden * act_bytes
    intermediate = positions * tower.intermediate * act_bytes
    pixels = images * tower.pixels * 4.0
    if tower.kind == "qwen2_5_vl":
        # the patch embedding's Conv3d takes a copy of its 5-D view of the flattened patches, kept with its output
        kept = hidden + 2 * positions * (tower.hidden // tower.heads) * act_bytes + images * tower.pixels * act_bytes
        # the gated MLP: SiLU(gate) and up alive beside their product; attention: norm, fused qkv, the rotated
        # q and k and their window-ordered copies, the output
        mlp = 2 * hidden + 3 * intermediate
        # q and k and their window-ordered copies, the output; eager runs one image or window at a time
        attention = (7 * hidden + 2 * tower.heads * tower.full_attention_span ** 2 * act_bytes) if eager \
            else 9 * hidden
    else:
        kept = 2 * hidden
        mlp = 2 * hidden + _ACTIVATION_COPIES.get(tower.activation, 2) * intermediate
        attention = (4 * hidden + 2 * images * tower.heads * tower.patches ** 2 * act_bytes) if eager else 6 * hidden
    return {"pixel values": pixels, "tower input": kept, "one tower layer": max(mlp, attention)}
