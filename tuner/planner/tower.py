"""The vision tower on a micro-batch's images: how many image tokens each image puts in the language model's
sequence, and what a frozen tower's forward holds while it runs.

Image tokens, as transformers 5.24's processors count them (one image a row, no tiling):

* LLaVA (``LlavaProcessor._get_num_multimodal_tokens``): ``(image_size // patch_size)**2`` plus the tower's class
  token (``num_additional_image_tokens``: CLIP's one, SigLIP's none), less one under
  ``vision_feature_select_strategy: default``, which drops it (``LlavaModel.get_image_features``: ``[:, 1:]``).
* Gemma 3 (``Gemma3Processor``: ``image_seq_length = mm_tokens_per_image``): the SigLIP patches average-pooled
  by ``Gemma3MultiModalProjector`` to ``mm_tokens_per_image`` (pan-and-scan off, its default).
* Qwen2-VL, Qwen2.5-VL and Qwen3-VL (``Qwen2VLImageProcessor.smart_resize``, the image processor of all three): the
  image resized to multiples of ``patch_size * spatial_merge_size`` within ``max_pixels`` (the image processor's
  default ``28 * 28 * 1280``, or the data's ``max_image_pixels`` where smaller), one patch per ``patch_size**2``
  pixels, and the merger's ``merge_size**2`` patches per token.  Planned for a square image of the most pixels
  allowed.
* Llama 4 (``Llama4Processor.replace_image_token``, ``Llama4ImageProcessor._preprocess``): the image padded into a
  canvas of ``image_size`` tiles, a global tile beside more than one (:func:`tuner.planner.image_tokens.llama4_canvas`:
  the most tiles within the data's pixel bound); each tile's ``(image_size // patch_size)**2`` patches (and the class
  token the tower adds, dropped after it) pixel-shuffled to ``1 / pixel_shuffle_ratio**2`` times fewer ``<|patch|>``
  tokens, the features' places; ``<|image_start|>``, ``<|image|>``, ``<|image_end|>`` and one separator a canvas
  tile besides.  Its processor hands bf16 pixel values over (``rescale_and_normalize``).
* Idefics 3 / SmolVLM (``Idefics3Processor._get_num_multimodal_tokens``, ``SmolVLMProcessor.replace_image_token``):
  the image split into tiles of the tower's ``image_size`` and a global image
  (:func:`tuner.planner.image_tokens.idefics3_grid`), each tile ``image_seq_len = (image_size // patch_size)**2 /
  scale_factor**2`` ``<image>`` tokens (the connector's pixel shuffle), each with ``<fake_token_around_image>`` and
  its ``<row_i_col_j>``, a newline a row, and the global image's fake tokens, tag and newlines.  The processor hands
  an int64 ``pixel_attention_mask`` over beside the pixel values.

TRL's ``DataCollatorForVisionLanguageModeling`` cuts ``input_ids`` after the processor expanded each image
placeholder, so the image tokens are inside ``max_seq_length``, not added to it; a sequence too short for them fails
in the model ("Image features and image tokens do not match"), which the plan's note says.

The tower's parameters are frozen and nothing it gets requires a gradient, so autograd saves nothing of it: its
forward is a transient moment (:data:`tuner.planner.items.TOWER`) before the language model's, holding the pixel
values, the tower's input and one encoder layer's working set (measured op by op against MemTracker:
tests/test_tower_memory.py, docs/memory.md "Vision tower").
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.planner.image_tokens import idefics3_grid, llama4_canvas, qwen_side

# transformers 5.24's config defaults for what a config.json may leave out (CLIPVisionConfig, SiglipVisionConfig,
# Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig, Qwen3VLVisionConfig, Gemma3Config, LlavaConfig, Llama4VisionConfig,
# Idefics3VisionConfig, SmolVLMVisionConfig)
_DEFAULTS = {
    "clip_vision_model": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                              image_size=224, patch_size=32, hidden_act="quick_gelu", num_channels=3),
    "siglip_vision_model": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                                image_size=224, patch_size=16, hidden_act="gelu_pytorch_tanh", num_channels=3),
    "qwen2_5_vl_vision": dict(hidden_size=3584, intermediate_size=3420, depth=32, num_heads=16, patch_size=14,
                              spatial_merge_size=2, temporal_patch_size=2, window_size=112, in_channels=3,
                              fullatt_block_indexes=[7, 15, 23, 31]),
    "qwen2_vl_vision": dict(embed_dim=1280, mlp_ratio=4, depth=32, num_heads=16, patch_size=14, spatial_merge_size=2,
                            temporal_patch_size=2, in_channels=3, hidden_act="quick_gelu"),
    "qwen3_vl_vision": dict(hidden_size=1152, intermediate_size=4304, depth=27, num_heads=16, patch_size=16,
                            spatial_merge_size=2, temporal_patch_size=2, in_channels=3, hidden_act="gelu_pytorch_tanh",
                            out_hidden_size=3584, deepstack_visual_indexes=[8, 16, 24]),
    "llama4_vision_model": dict(hidden_size=768, intermediate_size=5632, num_hidden_layers=34, num_attention_heads=16,
                                image_size=448, patch_size=14, num_channels=3, pixel_shuffle_ratio=0.5),
    "idefics3_vision": dict(hidden_size=1152, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=16,
                            image_size=224, patch_size=32, num_channels=3, hidden_act="gelu_pytorch_tanh"),
}
_DEFAULTS["smolvlm_vision"] = _DEFAULTS["idefics3_vision"]
# live copies of the activation function's input while it runs, per element of the MLP's intermediate width:
# quick_gelu is x * sigmoid(1.702 x) (fc1's output, the sigmoid, the product); silu is Qwen2.5-VL's gated MLP
# (SiLU(gate) and up beside their product); one fused op keeps input and output
_ACTIVATION_COPIES = {"quick_gelu": 3, "silu": 3}
QWEN_VL = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")  # the kinds fed flattened patches and their grid
IMAGE_SOURCES = ("builtin:shapes",)  # built-in data of image rows (data.format auto)


@dataclass(frozen=True)
class Tower:
    """A vision tower the planner models, and the image one row of the recipe's data gives it."""

    kind: str  # llava (CLIP or SigLIP), gemma3 (SigLIP + pooling), qwen2_vl, qwen2_5_vl, qwen3_vl, llama4, idefics3
    layers: int
    hidden: int
    intermediate: int
    heads: int
    patches: int  # positions one image's encoder layers run over (all its tiles')
    tokens: int  # image tokens one image's features fill in the language model's sequence
    channels: int
    pixels: int  # pixel values of one image, as the processor hands them over (channels x height x width)
    activation: str = "gelu"
    grid: tuple[int, int] = ()  # Qwen-VL: patches high and wide
    full_attention_span: int = 0  # Qwen-VL: the longest span one eager attention call covers (an image or a window)
    tiles: int = 1  # tiling processors: the tiles of one image, each a span of its own through the tower
    markers: int = 0  # tokens the processor adds around an image's tokens (Llama 4's start, end, separators)
    pixel_bytes: int = 4  # bytes of one pixel value as the processor hands it over (fp32; Llama 4's bf16)
    mask_bytes: int = 0  # bytes of a pixel's attention mask as the processor hands it over (Idefics 3's int64)
    deepstack_width: int = 0  # Qwen3-VL: the deepstack mergers' features a merged token, all mergers together
    window_span: int = 0  # Qwen-VL: patches one window's attention covers
    full_attention_layers: int = 0  # Qwen-VL: the layers attending over a whole image (fullatt_block_indexes)

    @property
    def sequence_tokens(self) -> int:
        """The tokens one image takes of the language model's sequence."""
        return self.tokens + self.markers

    def describe(self) -> str:
        tiles = f"{self.tiles} tiles of {self.patches // self.tiles} positions, " if self.tiles > 1 else ""
        markers = f" and {self.markers} marker tokens" if self.markers else ""
        return f"{self.kind} tower: {tiles}{self.patches} patches an image, {self.tokens} image tokens{markers}"


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
    grid = qwen_side(factor, max_image_pixels) // vision["patch_size"]
    window = (vision["window_size"] // factor) * vision["spatial_merge_size"]  # patches a side of one window
    span = grid * grid if vision["fullatt_block_indexes"] else min(grid, window) ** 2
    width = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    return Tower("qwen2_5_vl", vision["depth"], vision["hidden_size"], vision["intermediate_size"],
                 vision["num_heads"], grid * grid, grid * grid // vision["spatial_merge_size"] ** 2,
                 vision["in_channels"], grid * grid * width, "silu", (grid, grid), span,
                 window_span=min(grid, window) ** 2, full_attention_layers=len(vision["fullatt_block_indexes"]))


def _qwen2_vl(config: dict, max_image_pixels: int) -> Tower:
    """Qwen2-VL: Qwen2.5-VL's resize and merger, full attention over the image in every block, a quick_gelu MLP of
    ``mlp_ratio`` times the tower's ``embed_dim``."""
    vision = _vision(config)
    factor = vision["patch_size"] * vision["spatial_merge_size"]
    grid = qwen_side(factor, max_image_pixels) // vision["patch_size"]
    width = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    return Tower("qwen2_vl", vision["depth"], vision["embed_dim"], vision["embed_dim"] * vision["mlp_ratio"],
                 vision["num_heads"], grid * grid, grid * grid // vision["spatial_merge_size"] ** 2,
                 vision["in_channels"], grid * grid * width, vision["hidden_act"], (grid, grid), grid * grid)


def _qwen3_vl(config: dict, max_image_pixels: int) -> Tower:
    """Qwen3-VL: Qwen2.5-VL's resize and merger, full attention in every block, a learned position embedding
    interpolated to the grid, and the deepstack mergers' features of some blocks kept to the tower's end."""
    vision = _vision(config)
    factor = vision["patch_size"] * vision["spatial_merge_size"]
    grid = qwen_side(factor, max_image_pixels) // vision["patch_size"]
    width = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    # the features of the deepstack blocks before the last, alive through the blocks after them
    deepstack = sum(index < vision["depth"] - 1 for index in vision["deepstack_visual_indexes"])
    return Tower("qwen3_vl", vision["depth"], vision["hidden_size"], vision["intermediate_size"],
                 vision["num_heads"], grid * grid, grid * grid // vision["spatial_merge_size"] ** 2,
                 vision["in_channels"], grid * grid * width, vision["hidden_act"], (grid, grid), grid * grid,
                 deepstack_width=deepstack * vision["out_hidden_size"])


def _llama4(config: dict, max_image_pixels: int) -> Tower:
    vision = _vision(config)
    side = vision["image_size"]
    rows, cols = llama4_canvas(side, max_image_pixels)
    cells = rows * cols
    tiles = cells + (cells > 1)  # the global tile: the whole image resized to one tile, beside more than one
    patches = (side // vision["patch_size"]) ** 2
    per_tile = patches // round(1 / vision["pixel_shuffle_ratio"] ** 2)
    return Tower("llama4", vision["num_hidden_layers"], vision["hidden_size"], vision["intermediate_size"],
                 vision["num_attention_heads"], tiles * (patches + 1), tiles * per_tile, vision["num_channels"],
                 tiles * vision["num_channels"] * side * side, tiles=tiles, markers=3 + (cells if cells > 1 else 0),
                 pixel_bytes=2)


def _idefics3(config: dict) -> Tower:
    vision = _vision(config)
    side = vision["image_size"]
    rows, cols = idefics3_grid()
    tiles = rows * cols + 1  # and the global image
    patches = (side // vision["patch_size"]) ** 2
    per_tile = patches // config.get("scale_factor", 2) ** 2  # image_seq_len
    # each tile's fake token and row/column tag, a newline a row; the global image's two fake tokens, its tag, and
    # the newline before it (a separate token where the tokenizer does not merge "\n\n")
    markers = 3 + rows * (2 * cols + 1) + (rows > 0)
    return Tower("idefics3", vision["num_hidden_layers"], vision["hidden_size"], vision["intermediate_size"],
                 vision["num_attention_heads"], tiles * patches, tiles * per_tile, vision["num_channels"],
                 tiles * vision["num_channels"] * side * side, vision["hidden_act"], tiles=tiles, markers=markers,
                 mask_bytes=8)


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
    if kind == "qwen2_vl":
        return _qwen2_vl(config, recipe.data.max_image_pixels)
    if kind == "qwen3_vl":
        return _qwen3_vl(config, recipe.data.max_image_pixels)
    if kind == "llama4":
        return _llama4(config, recipe.data.max_image_pixels)
    if kind in ("idefics3", "smolvlm"):
        return _idefics3(config)
    return None


def tower_bytes(tower: Tower, images: int, act_bytes: int, eager: bool) -> dict[str, float]:
    """Bytes live at the peak of a frozen tower's forward over ``images`` images, by what holds them: the pixel
    values (as the image processor makes them, with Idefics 3's mask), the tower's input (the patch embeddings and
    the layer's input; Qwen-VL: the layer's input and its rotary cos/sin; Idefics 3: also the copies of the pixel
    values and mask and the attention mask), and one encoder layer at its worst step -- attention (its norm, q/k/v,
    the output and its reshaped copy; eager: the scores and their softmax over the longest span instead of the
    copies) or the MLP (the residual sum, its norm, and the intermediate activations)."""
    positions = images * tower.patches
    hidden = positions * tower.hidden * act_bytes
    intermediate = positions * tower.intermediate * act_bytes
    pixels = images * tower.pixels * float(tower.pixel_bytes + tower.mask_bytes / tower.channels)
    if tower.kind in QWEN_VL:
        # the layer's input and the rotary cos/sin; Qwen3-VL: its interpolated position embedding, the four corners'
        # indices (int64) and weights a patch, and the deepstack features
        kept = hidden + 2 * positions * (tower.hidden // tower.heads) * act_bytes
        if tower.kind == "qwen3_vl":
            kept += hidden + positions * 4 * (8 + 4) + images * tower.tokens * tower.deepstack_width * act_bytes
        # the MLP (Qwen2.5-VL's gated one, the others' fc1 and activation); attention: norm, fused qkv, the rotated
        # q and k and their window-ordered copies, the output
        mlp = 2 * hidden + _ACTIVATION_COPIES.get(tower.activation, 2) * intermediate
        # q and k and their window-ordered copies, the output; eager runs one image or window at a time
        attention = (7 * hidden + 2 * tower.heads * tower.full_attention_span ** 2 * act_bytes) if eager \
            else 9 * hidden
    elif tower.kind == "llama4":
        kept = 2 * hidden
        # eager: one tile's scores a head, all tiles in one call; the softmax's output stays with the layer
        # (returned as its attention weights) through the MLP
        scores = images * tower.tiles * tower.heads * (tower.patches // tower.tiles) ** 2 * act_bytes if eager else 0
        mlp = 2 * hidden + 2 * intermediate + scores
        # the rotary embedding in complex fp32 (vision_apply_rotary_emb): q and k products, and under 16-bit
        # activations their fp32 copies before and 16-bit copies after
        rotary = 2 * positions * tower.hidden * 4 + (act_bytes < 4) * (2 * positions * tower.hidden * 4 + 2 * hidden)
        attention = 4 * hidden + max(rotary, 2 * scores)
    elif tower.kind == "idefics3":
        # get_image_features' copies of the pixel values (in the activations' dtype) and of their int64 mask, without
        # the padding tiles; the bidirectional mask over each tile's patches (bool; eager: in the activations' dtype)
        span = tower.patches // tower.tiles
        scores = images * tower.tiles * tower.heads * span ** 2
        mask = images * tower.tiles * span ** 2
        kept = 2 * hidden + images * tower.pixels * (act_bytes + tower.mask_bytes / tower.channels) + \
            mask * (act_bytes if eager else 1)
        # eager: the softmax's output stays with the layer through the MLP (its attention weights)
        mlp = 2 * hidden + 2 * intermediate + (scores * act_bytes if eager else 0)
        # norm, q, k, v; sdpa: the mask turned to the activations' dtype and the output; eager: the scores and their
        # scaled copy, or under 16-bit activations the masked scores, their fp32 copy and its softmax
        attention = 4 * hidden + ((2 * scores * act_bytes if act_bytes == 4 else scores * (act_bytes + 8)) if eager
                                  else mask * act_bytes + hidden)
    else:
        kept = 2 * hidden
        mlp = 2 * hidden + _ACTIVATION_COPIES.get(tower.activation, 2) * intermediate
        attention = (4 * hidden + 2 * images * tower.heads * tower.patches ** 2 * act_bytes) if eager else 6 * hidden
    return {"pixel values": pixels, "tower input": kept, "one tower layer": max(mlp, attention)}
