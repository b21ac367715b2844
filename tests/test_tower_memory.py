"""A frozen vision tower on image rows (issue 50, "Plan"): the image tokens each image puts in the language model's
sequence and the tower's forward, planned per tower kind and held to a fake-tensor trace of the real step on tiny
instances -- LLaVA's CLIP (the demo model), Gemma 3's SigLIP with its pooling projector, Qwen2.5-VL's window
attention with its merger (and Qwen2-VL's full attention), Llama 4's tiles and pixel shuffle, Idefics 3 / SmolVLM's
tiles and connector.  The errors are tabled in docs/memory.md, "Vision tower"."""
from __future__ import annotations

import json

import pytest

from image_text_configs import tiny_config
from plan_trace import TOLERANCE, assert_plan_matches_trace
from tuner.planner import plan
from tuner.planner.items import TOWER
from tuner.recipe.io import validate_recipe

# the tower's image size (or Qwen-VL's pixel bound) chosen so that its tokens fit a 128-token sequence
TOWERS = {
    "llava": lambda config: config["vision_config"].update(image_size=64, patch_size=8),  # 65 patches, 64 tokens
    "gemma3": lambda config: (config["vision_config"].update(image_size=128, patch_size=8),  # 256 patches
                              config.update(mm_tokens_per_image=16)),  # pooled 4x4 to 16 tokens
    # 1024 patches, pooled 8x8 to 16 tokens: eager attention over them outgrows the language model's step
    # (a vocabulary above the tower's 1024 positions: tuner once read the first embedding as the vocabulary)
    "gemma3-large": lambda config: (config["vision_config"].update(image_size=256, patch_size=8),
                                    config["text_config"].update(vocab_size=2048),
                                    config.update(mm_tokens_per_image=16)),
    "qwen2_5_vl": lambda config: (config["vision_config"].update(patch_size=8, window_size=32),
                                  config["text_config"].update(rope_parameters={  # halves of head_dim 16
                                      "rope_theta": 1e6, "rope_type": "default", "mrope_section": [2, 3, 3]})),
}
PIXELS = {"qwen2_5_vl": 128 * 128,  # data.max_image_pixels: a 16 x 16 patch grid, 64 tokens
          "qwen2_5_vl-large": 256 * 256}  # 32 x 32 patches, 256 tokens: eager full attention over an image
TOWERS["qwen2_5_vl-large"] = TOWERS["qwen2_5_vl"]
# Qwen2-VL: no windows, full attention in every block, over the same images
TOWERS["qwen2_vl"] = lambda config: (config["vision_config"].update(patch_size=8), config["text_config"].update(
    rope_parameters={"rope_theta": 1e6, "rope_type": "default", "mrope_section": [2, 3, 3]}))
TOWERS["qwen2_vl-large"] = TOWERS["qwen2_vl"]
# Qwen3-VL: full attention, an interpolated position embedding, a deepstack merger after the last block; its whole
# step is not traced (its language model adds the deepstack features by a boolean index, which fake tensors cannot
# size)
TOWERS["qwen3_vl"] = lambda config: (config["vision_config"].update(patch_size=8), config["text_config"].update(
    rope_parameters={"rope_theta": 1e6, "rope_type": "default", "mrope_section": [2, 3, 3]}))
TOWERS["qwen3_vl-large"] = TOWERS["qwen3_vl"]
PIXELS.update({"qwen3_vl": PIXELS["qwen2_5_vl"], "qwen3_vl-large": PIXELS["qwen2_5_vl-large"]})
PIXELS.update({"qwen2_vl": PIXELS["qwen2_5_vl"], "qwen2_vl-large": PIXELS["qwen2_5_vl-large"]})
# Llama 4: 4 x 4 patches a tile (and its class token), pixel-shuffled to 4 tokens; its adapter takes 4 x hidden wide
# patches, the tower's intermediate width; 17 tiles within the default pixel bound (16 and the global one)
TOWERS["llama4"] = lambda config: config["vision_config"].update(image_size=32, patch_size=8, intermediate_size=128)
# 16 x 16 patches a tile, 3 tiles (2 and the global one) within 256 pixels: eager attention outgrows the MLP
TOWERS["llama4-large"] = lambda config: config["vision_config"].update(image_size=128, patch_size=8,
                                                                       intermediate_size=128)
PIXELS["llama4-large"] = 16 * 16
SEQUENCE = {"qwen2_5_vl-large": 384, "qwen2_vl-large": 384, "qwen3_vl-large": 384, "llama4-large": 256}
# Llama 4's processor hands over bf16 pixel values, which an fp32 tower refuses: its cells run in bf16
DTYPE = {"llama4": "bfloat16", "llama4-large": "bfloat16"}
# Idefics 3 / SmolVLM: 4 x 4 patches a tile, pixel-shuffled to 4 tokens; 17 tiles (4 x 4 and the global image)
TOWERS["idefics3"] = lambda config: config["vision_config"].update(image_size=32, patch_size=8)
TOWERS["smolvlm"] = TOWERS["idefics3"]
# 16 x 16 patches a tile, 64 tokens each: eager attention over a tile outgrows the MLP
TOWERS["idefics3-large"] = lambda config: config["vision_config"].update(image_size=128, patch_size=8)
SEQUENCE["idefics3-large"] = 1280
# LoRA on the language model (the tower and the projector frozen); LLaVA's and Idefics 3's cells were -12% to -19%
# low while the planner read the tower's position embedding as the vocabulary (docs/memory.md, "Vision tower")
CELLS = [("gemma3", "lora", "sdpa"), ("gemma3", "lora", "eager"), ("gemma3-large", "lora", "eager"),
         ("qwen2_5_vl", "lora", "sdpa"), ("qwen2_5_vl", "lora", "eager"), ("qwen2_5_vl-large", "lora", "eager"),
         ("qwen2_vl", "lora", "sdpa"), ("qwen2_vl", "lora", "eager"), ("qwen2_vl-large", "lora", "eager"),
         ("llava", "lora", "sdpa"), ("llava", "lora", "eager"), ("idefics3", "lora", "sdpa"), ("idefics3", "lora", "eager")]
TOWER_CELLS = [(kind, attention) for kind in ("llava", "gemma3", "gemma3-large", "qwen2_5_vl", "qwen2_5_vl-large",
                                              "qwen2_vl", "qwen2_vl-large", "qwen3_vl", "qwen3_vl-large",
                                              "llama4", "llama4-large", "idefics3", "idefics3-large", "smolvlm")
               for attention in ("sdpa", "eager")]


def _model_dir(root, name: str) -> str:
    config = tiny_config(name.split("-")[0])
    TOWERS[name](config)
    folder = root / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _recipe(model: str, method: str = "full", attention: str = "sdpa", pixels: int = 4096 * 4096, seq: int = 128,
            dtype: str = "float32", **data):
    return validate_recipe({"model": {"id": model, "dtype": dtype}, "method": {"kind": method},
                            "data": {"source": "rows.jsonl", "format": "image_prompt_answer",
                                     "max_image_pixels": pixels, **data},
                            "memory": {"mixed_precision": "no", "attention": attention},
                            "training": {"max_seq_length": seq, "micro_batch_size": 2}})


def _tower_items(memory_plan) -> float:
    return sum(item.gib for item in memory_plan.devices[0].items if item.source == "vision-tower")


@pytest.mark.parametrize("model_type, method, attention", CELLS, ids=["-".join(cell) for cell in CELLS])
@pytest.mark.slow
def test_each_tower_kind_plans_its_traced_step(tmp_path, model_type, method, attention):
    assert_plan_matches_trace(_recipe(_model_dir(tmp_path, model_type), method, attention,
                                      PIXELS.get(model_type, 4096 * 4096), SEQUENCE.get(model_type, 128)))


@pytest.mark.parametrize("model_type, attention", TOWER_CELLS, ids=["-".join(cell) for cell in TOWER_CELLS])
@pytest.mark.slow
def test_each_tower_forward_plans_its_traced_peak(tmp_path, model_type, attention):
    """The tower's moment alone: its working set and the batch's pixel values (the tracker told of them) against
    MemTracker's peak of ``get_image_features`` on the batch.  Llama 4's is the only
    trace of its tower: Llama4ForConditionalGeneration cannot run a training step in transformers 5.24 (its forward
    reads ``outputs.image_outputs``, which its language model's output does not have)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForImageTextToText

    from tuner.loading.image_batch import image_batch, image_tower, tower_traceable
    from tuner.loading.simulate import _snapshot_gib, frozen_aware_tracker
    from tuner.catalog.meta_inventory import config_object

    dtype = DTYPE.get(model_type, "float32")
    recipe = _recipe(_model_dir(tmp_path, model_type), "lora", attention, PIXELS.get(model_type, 4096 * 4096),
                     SEQUENCE.get(model_type, 128), dtype)
    planned = sum(item.gib for item in plan(recipe).devices[0].items if item.phase == TOWER or
                  item.name.startswith("vision tower: pixel values"))
    tower = image_tower(recipe)
    config = config_object(json.loads((tmp_path / model_type / "config.json").read_text()), "test")
    config._attn_implementation = attention
    for sub in (config.vision_config, config.text_config):
        sub._attn_implementation = attention
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config, dtype=getattr(torch, dtype))
    model.requires_grad_(False)
    with FakeTensorMode(allow_non_fake_inputs=True), tower_traceable(tower, 2):
        model = model.to_empty(device="cpu")
        model.train()
        inputs = image_batch(model, tower, 2, SEQUENCE.get(model_type, 128))
        pixels = {name: inputs[name] for name in ("pixel_values", "pixel_attention_mask", "image_grid_thw")
                  if name in inputs}
        tracker = frozen_aware_tracker()
        tracker.track_external(model, *pixels.values())
        with tracker:
            getattr(model, "model", model).get_image_features(**pixels)
        _, by_category = _snapshot_gib(tracker)
    traced = by_category.get("activations", 0.0) + by_category.get("other", 0.0)
    assert planned == pytest.approx(traced, rel=TOLERANCE), (planned * 1024, traced * 1024, by_category)


def test_the_demo_plans_its_images_and_its_trace(tmp_path):
    from tuner.recipe.registry import builtin_path
    from tuner.recipe.io import load_recipe

    memory_plan = assert_plan_matches_trace(load_recipe(builtin_path("demo-vlm")))
    note = next(n for n in memory_plan.notes if n.startswith("image-text model"))
    assert "17 patches an image, 16 image tokens" in note and "inside max_seq_length (64" in note
    assert "text-only rows never run the vision tower" not in note


def test_text_rows_never_run_the_tower(tmp_path):
    memory_plan = plan(_recipe(_model_dir(tmp_path, "gemma3"), format="chat"))
    assert _tower_items(memory_plan) == 0
    assert "text-only rows never run the vision tower" in memory_plan.notes[0]


def test_image_tokens_per_tower_kind(tmp_path):
    notes = {kind: next(n for n in plan(_recipe(_model_dir(tmp_path, kind), pixels=PIXELS.get(kind, 2**24))).notes
                        if n.startswith("image-text"))
             for kind in ("llava", "gemma3", "qwen2_5_vl", "qwen2_vl", "qwen3_vl", "llama4", "idefics3", "smolvlm")}
    assert "65 patches an image, 64 image tokens" in notes["llava"]  # 8x8 patches and CLIP's class token, dropped
    assert "256 patches an image, 16 image tokens" in notes["gemma3"]  # mm_tokens_per_image
    for kind in ("qwen2_5_vl", "qwen2_vl", "qwen3_vl"):  # 128x128 px / 8 px, 2x2 merged
        assert "256 patches an image, 64 image tokens" in notes[kind]
    # 16 tiles and the global one of 4x4 patches and a class token, each shuffled to 4 tokens; start, <|image|>,
    # end and a separator a tile
    assert "17 tiles of 17 positions, 289 patches an image, 68 image tokens and 19 marker tokens" in notes["llama4"]
    # 4 x 4 tiles and the global image of 4 x 4 patches, shuffled 2 x 2 to 4 tokens; a fake token and a row/column
    # tag a tile, a newline a row, the global image's two fake tokens, tag and newline
    for kind in ("idefics3", "smolvlm"):
        assert "17 tiles of 16 positions, 272 patches an image, 68 image tokens and 40 marker tokens" in notes[kind]


def test_llama4_trains_no_step_in_this_transformers(tmp_path):
    """Its tower is planned, its step is not traced: the trace says why instead of failing in the model."""
    from tuner.loading.simulate import why_not_simulable

    recipe = _recipe(_model_dir(tmp_path, "llama4"), "lora", dtype="bfloat16")
    assert plan(recipe).verdict != "cannot judge"
    assert "outputs.image_outputs" in why_not_simulable(recipe)


def test_qwen3_vl_traces_its_tower_alone(tmp_path):
    from tuner.loading.simulate import why_not_simulable

    recipe = _recipe(_model_dir(tmp_path, "qwen3_vl"), "lora", pixels=PIXELS["qwen3_vl"])
    assert plan(recipe).verdict != "cannot judge"
    assert "visual_pos_masks" in why_not_simulable(recipe)


def test_a_larger_image_grows_the_tower_and_a_short_sequence_is_named(tmp_path):
    model = _model_dir(tmp_path, "qwen2_5_vl")
    small, large = plan(_recipe(model, pixels=128 * 128)), plan(_recipe(model, pixels=256 * 256))
    assert _tower_items(large) > 3 * _tower_items(small)
    assert any("shorter than the 256 image tokens" in note for note in large.notes)


def test_an_unmodelled_tower_on_image_rows_gets_no_verdict(tmp_path):
    config = tiny_config("mistral3")
    (tmp_path / "config.json").write_text(json.dumps(config))
    images, text = plan(_recipe(str(tmp_path))), plan(_recipe(str(tmp_path), format="chat"))
    assert images.verdict == "cannot judge" and not images.fits
    assert "vision tower (PixtralVisionModel)" in images.notes[0]
    assert text.verdict != "cannot judge"
