"""A micro-batch of image-text rows for the fake-tensor trace (:mod:`tuner.loading.simulate`): each row's image as
the processor hands it to the model (square pixel values for a fixed-resolution tower, each tile's for Llama 4,
flattened patches and their grid for Qwen-VL) and its image tokens at the start of the row, as TRL's collator lays
them out within ``max_seq_length``.  The sizes are the planner's (:mod:`tuner.planner.tower`), so plan and trace
see one image."""
from __future__ import annotations

import os
from contextlib import contextmanager

from tuner.planner.tower import QWEN_VL, has_image_data, tower_of

_CHECKS = "TRANSFORMERS_DISABLE_TORCH_CHECK"
# fake tensors keep small tensors made in the trace (torch.tensor) as constants, which .tolist() can read: raised so
# that Qwen-VL's image grid (3 numbers an image) and the split sizes made from it stay constants
_GRID_NUMEL_LIMIT = 3 * 256

# Qwen-VL's index helpers (transformers.vision_utils): lengths a fake tensor cannot answer (.tolist())
_QWEN_INDEX_HELPERS = ("get_vision_position_ids", "get_vision_attention_seqlens", "get_vision_window_index",
                       "get_vision_interpolation_indices_and_weights")
# per Qwen-VL kind: its modeling module and its tower's attention class
_QWEN_MODULES = {"qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLVisionAttention"), "qwen2_vl": ("qwen2_vl", "VisionAttention"),
                 "qwen3_vl": ("qwen3_vl", "Qwen3VLVisionAttention")}


def has_image_rows(recipe) -> bool:
    """An image-text model trained on rows with images."""
    from tuner.catalog.models import model_facts

    inventory = model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code).inventory
    return inventory is not None and bool(inventory.parts) and has_image_data(recipe)


def image_tower(recipe):
    """The planner's tower of ``recipe``'s model, when its rows carry images and the tower is one it models."""
    from tuner.catalog.models import model_facts

    if not has_image_rows(recipe):
        return None
    return tower_of(model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code).inventory,
                    recipe)


def image_batch(model, tower, batch: int, seq: int) -> dict:
    """The inputs of one micro-batch, made inside the trace's FakeTensorMode (under :func:`tower_traceable`): input
    ids whose first ``tower.tokens`` are the image token (real tensors, as the collator's are), labels, fake pixel
    values of one image per row, and Qwen-VL's grid (a constant the model can read), its token types and 3D
    position ids (computed from the real ids, as the model would), or Gemma 3's token types."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    config = model.config
    vision, vocab = config.vision_config, config.get_text_config().vocab_size
    image_id = getattr(config, "image_token_id", None)
    image_id = config.image_token_index if image_id is None else image_id
    with unset_fake_temporarily():
        ids = torch.randint(0, vocab, (batch, seq))
        ids[ids == image_id] = (image_id + 1) % vocab
        ids[:, :tower.tokens] = image_id
        image_types = (ids == image_id).int()
        inputs = {"input_ids": ids, "labels": ids}
        if tower.kind in QWEN_VL:
            grid = torch.tensor([[1, *tower.grid]] * batch)
            inputs["mm_token_type_ids"] = image_types
            base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under PEFT's wrapper
            inputs["position_ids"] = base.model.compute_3d_position_ids(  # by name: the kinds order them apart
                input_ids=ids, image_grid_thw=grid, video_grid_thw=None, inputs_embeds=None, attention_mask=None,
                cache=None, mm_token_type_ids=image_types)
        if tower.kind == "gemma3":  # the processor's token types: bidirectional attention over each image's tokens
            inputs["token_type_ids"] = image_types.long()
    if tower.kind in QWEN_VL:
        width = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
        inputs["pixel_values"] = torch.randn(batch * tower.patches, width)
        inputs["image_grid_thw"] = torch.tensor([[1, *tower.grid]] * batch)  # a constant: numel within the limit
    elif tower.kind == "idefics3":  # each row's tiles and global image, and their int64 mask: constants
        side = vision.image_size
        with unset_fake_temporarily():
            pixels = torch.randn(batch, tower.tiles, vision.num_channels, side, side)
            mask = torch.ones(batch, tower.tiles, side, side, dtype=torch.int64)
        inputs["pixel_values"] = torch.ops.aten.lift_fresh_copy(pixels)
        inputs["pixel_attention_mask"] = torch.ops.aten.lift_fresh_copy(mask)
    else:  # square pixel values of one tile a row, or of each tile (Llama 4's, in the bf16 its processor makes)
        side = vision.image_size
        dtype = torch.bfloat16 if tower.pixel_bytes == 2 else torch.float32
        inputs["pixel_values"] = torch.randn(batch * tower.tiles, vision.num_channels, side, side, dtype=dtype)
    return inputs


@contextmanager
def tower_traceable(tower, batch: int):
    """The image step on fake tensors: transformers' data checks (image tokens against features) off, as its own
    switch turns them off (``TRANSFORMERS_DISABLE_TORCH_CHECK``): a fake tensor cannot answer them; for Qwen-VL
    its window and position indices computed on real tensors (they depend on the grid only), the window lengths its
    attention splits by (``lengths.tolist()``) handed to it as a numpy array, which answers; for Idefics 3 the
    batch's pixel values and mask kept as constants, which its padding-tile check reads (``pixel_values[real]``,
    ``.tolist()``)."""
    previous = os.environ.get(_CHECKS)
    os.environ[_CHECKS] = "1"
    try:
        with _qwen_indices_real(tower), _idefics3_constants(tower, batch):
            yield
    finally:
        if previous is None:
            del os.environ[_CHECKS]
        else:
            os.environ[_CHECKS] = previous


@contextmanager
def _qwen_indices_real(tower):
    """Qwen-VL's index helpers on real tensors, and its attention's window lengths as a numpy array."""
    if tower is None or tower.kind not in _QWEN_MODULES:
        yield
        return
    import importlib

    import numpy as np
    from torch._subclasses import fake_tensor
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    name, attention_class = _QWEN_MODULES[tower.kind]
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")

    def constant(value):  # the grid, a fake tensor's constant, as the real tensor it holds
        return value.constant if isinstance(value, fake_tensor.FakeTensor) and value.constant is not None else value

    def real(function):
        def wrapped(*args, **kwargs):
            with unset_fake_temporarily():
                return function(*map(constant, args), **{key: constant(value) for key, value in kwargs.items()})
        return wrapped

    attention = getattr(module, attention_class)
    attention_forward = attention.forward

    def forward(self, hidden_states, cu_seqlens, *args, **kwargs):
        with unset_fake_temporarily():
            cu_seqlens = np.array(cu_seqlens.tolist())
        return attention_forward(self, hidden_states, cu_seqlens, *args, **kwargs)

    originals = {name: getattr(module, name) for name in _QWEN_INDEX_HELPERS if hasattr(module, name)}
    for name, function in originals.items():
        setattr(module, name, real(function))
    attention.forward = forward
    limit, fake_tensor.CONSTANT_NUMEL_LIMIT = fake_tensor.CONSTANT_NUMEL_LIMIT, _GRID_NUMEL_LIMIT
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = limit
        attention.forward = attention_forward
        for name, function in originals.items():
            setattr(module, name, function)


@contextmanager
def _idefics3_constants(tower, batch: int):
    """Fake tensors as large as the batch's pixel values keep their real values (``CONSTANT_NUMEL_LIMIT``): the
    padding tiles get_image_features drops are found from them, as the model would."""
    if tower is None or tower.kind != "idefics3":
        yield
        return
    from torch._subclasses import fake_tensor

    limit, fake_tensor.CONSTANT_NUMEL_LIMIT = fake_tensor.CONSTANT_NUMEL_LIMIT, batch * tower.pixels
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = limit
