"""device_map="auto" loading of the demo model: split over CPU and disk, adapters, run directories."""
from __future__ import annotations

import pytest

from tuner.fileio import atomic_write_text
from tuner.infer.load import load_for_inference
from tuner.infer.target import resolve_target
from tuner.loading.model import ModelLoadError
from tuner.recipe.io import recipe_to_yaml, validate_recipe
from tuner.rundir.layout import LOCK_FILE

PROMPTS = ["reverse\nabc=", "reverse\nhello="]
FLOAT32 = ["model.dtype=float32", "memory.mixed_precision=no"]
ALL_ON_CPU = {"cpu": "1GiB"}


def greedy_ids(loaded, prompts=PROMPTS, new_tokens=12):
    """Generated token ids (not text), so a comparison is token for token."""
    import torch

    from tuner.infer.generate import execution_device, generation_kwargs

    tokenizer = loaded.tokenizer
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(
        execution_device(loaded.model))
    with torch.no_grad():
        output = loaded.model.generate(**batch, **generation_kwargs(tokenizer, new_tokens, greedy=True))
    return output[:, batch["input_ids"].shape[1]:].tolist()


def cpu_and_disk_budget(loaded) -> dict:
    """A CPU budget that holds some but not all layers (the demo's weights are ~3 MiB)."""
    return {"cpu": int(loaded.placement.weights_bytes * 0.85)}


@pytest.fixture(scope="module")
def demo_target(demo_model_path):
    return resolve_target(model=str(demo_model_path), overrides=FLOAT32)


@pytest.fixture(scope="module")
def unsplit(demo_target):
    return load_for_inference(demo_target, context=32, max_memory=ALL_ON_CPU)


def test_split_over_cpu_and_disk_generates_the_same_tokens(demo_target, unsplit, tmp_path):
    split = load_for_inference(demo_target, context=32, max_memory=cpu_and_disk_budget(unsplit),
                               offload_folder=tmp_path / "offload")
    rows = {row.device: row for row in split.placement.devices}
    assert set(rows) == {"cpu", "disk"} and rows["cpu"].layers >= 1 and rows["disk"].layers >= 1
    assert rows["cpu"].layers + rows["disk"].layers == 4
    assert split.placement.weights_bytes == unsplit.placement.weights_bytes
    assert any("disk" in warning for warning in split.placement.warnings())
    assert [row.device for row in unsplit.placement.devices] == ["cpu"]
    assert greedy_ids(split) == greedy_ids(unsplit)


def make_lora_run(run_dir, demo_model_path):
    """A run directory as a LoRA training leaves it: lock file, final/ with the adapter and tokenizer.

    The adapter's weights are random (not the zero-initialised B of a fresh LoRA), so applying it changes outputs.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = validate_recipe({"name": "lora-run", "model": {"id": "builtin:demo", "dtype": "float32"},
                              "memory": {"mixed_precision": "no"}, "method": {"kind": "lora"},
                              "output": {"dir": str(run_dir)}})
    atomic_write_text(run_dir / LOCK_FILE, recipe_to_yaml(recipe))
    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False, task_type="CAUSAL_LM")
    get_peft_model(base, config).save_pretrained(run_dir / "final")
    AutoTokenizer.from_pretrained(demo_model_path).save_pretrained(run_dir / "final")
    atomic_write_text(run_dir / "final" / LOCK_FILE, recipe_to_yaml(recipe))
    return run_dir


def test_lora_run_directory_applies_the_adapter_on_its_base_model(tmp_path, demo_model_path, unsplit):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = make_lora_run(tmp_path / "runs" / "lora-run", demo_model_path)
    target = resolve_target(str(run_dir))
    assert target.adapter == run_dir / "final" and target.model_path == str(demo_model_path)
    assert target.offload_folder == run_dir / "offload"
    loaded = load_for_inference(target, context=32, max_memory=ALL_ON_CPU)
    with_adapter = greedy_ids(loaded)

    reference = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32), str(run_dir / "final"))
    reference.eval()
    assert with_adapter == greedy_ids(type(loaded)(reference, loaded.tokenizer, loaded.placement, target))
    assert with_adapter != greedy_ids(unsplit)

    # adapters on disk-offloaded layers would be dropped silently by peft: refused with what to do instead
    with pytest.raises(ModelLoadError, match="offloaded to disk.*merged"):
        load_for_inference(target, context=32, max_memory=cpu_and_disk_budget(unsplit))


def test_adapter_flag_on_an_ad_hoc_model(tmp_path, demo_model_path):
    run_dir = make_lora_run(tmp_path / "lora-run", demo_model_path)
    target = resolve_target(model=str(demo_model_path), adapter=str(run_dir))
    assert target.adapter == run_dir / "final"
    with pytest.raises(ModelLoadError, match="adapter_config.json"):
        resolve_target(model=str(demo_model_path), adapter=str(demo_model_path))


def test_run_directory_without_a_final_model_says_what_to_do(tmp_path):
    recipe = validate_recipe({})
    atomic_write_text(tmp_path / LOCK_FILE, recipe_to_yaml(recipe))
    with pytest.raises(ModelLoadError, match="no final/ model yet"):
        resolve_target(str(tmp_path))


def test_nothing_to_run():
    with pytest.raises(ModelLoadError, match="--model"):
        resolve_target()


def test_on_a_cpu_the_weights_load_in_float32_unless_the_recipe_names_a_dtype(tmp_path, demo_model_path):
    """The schema's training default (bf16 mixed precision, so model.dtype bfloat16) does not reach a CPU load:
    the demo's float32 checkpoint stays float32; a dtype the user names (--set, a recipe) is kept, and a run's
    lock file, which states every default, counts as the training's choice."""
    import torch

    bare = resolve_target(model=str(demo_model_path))
    assert bare.recipe.model.dtype == "bfloat16"  # what training would use
    loaded = load_for_inference(bare, context=32, max_memory=ALL_ON_CPU)
    assert loaded.model.dtype == torch.float32
    assert any("float32 on the CPU" in note and "--set model.dtype=bfloat16" in note for note in loaded.placement.notes)

    named = resolve_target(model=str(demo_model_path), overrides=["model.dtype=bfloat16"])
    assert load_for_inference(named, context=32, max_memory=ALL_ON_CPU).model.dtype == torch.bfloat16

    run_dir = make_lora_run(tmp_path / "lora-run", demo_model_path)
    lock = validate_recipe({"name": "lora-run", "method": {"kind": "lora"}, "output": {"dir": str(run_dir)}})
    atomic_write_text(run_dir / "final" / LOCK_FILE, recipe_to_yaml(lock))  # trained with the bf16 default
    assert "dtype: bfloat16" in (run_dir / "final" / LOCK_FILE).read_text()
    assert load_for_inference(resolve_target(str(run_dir)), context=32,
                              max_memory=ALL_ON_CPU).model.get_base_model().dtype == torch.float32
    kept = resolve_target(str(run_dir), overrides=["model.dtype=bfloat16"])
    assert load_for_inference(kept, context=32, max_memory=ALL_ON_CPU).model.get_base_model().dtype == torch.bfloat16
