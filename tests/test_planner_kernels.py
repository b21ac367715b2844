"""The kernels a plan assumes are checked and named: TRL's fused log-prob fold (Triton or torch ops), flash-attention
and Liger are planned where the recipe and the training machine allow them, the fallback where they do not, and
`tuner doctor` says which this machine will use."""
from __future__ import annotations

import pytest

from tuner.doctor import check_kernels
from tuner.planner import kernels as kernel_choice
from tuner.planner import plan
from tuner.planner.items import FORWARD_BACKWARD
from tuner.planner.preference import CPU_BACKWARD_TILES, TILE_TOKENS, TILE_VOCAB
from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.registry import builtin_path


def _fused_head(memory_plan) -> float:
    """The fused head's bytes at the training step's loss moment."""
    return sum(i.bytes for i in memory_plan.gpu.items if i.source == "trl-fused-head" and i.live_in(FORWARD_BACKWARD))


def _on_a_gpu_machine(monkeypatch, *missing: str) -> None:
    """This machine as a GPU training machine (an NVIDIA driver) without the modules in ``missing``."""
    monkeypatch.setattr(kernel_choice, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(kernel_choice, "installed", lambda module: module not in missing)


def test_a_gpu_dpo_plan_names_the_fold_it_assumes_and_plans_the_torch_fold_where_triton_is_missing(monkeypatch):
    recipe = load_recipe(builtin_path("llama3.1/8b-lora-dpo"))
    monkeypatch.setattr(kernel_choice, "has_nvidia_gpu", lambda: False)
    elsewhere = plan(recipe)  # planned away from the training machines: Triton assumed, and said
    assert any("Triton fold" in note and "assuming triton" in note for note in elsewhere.notes)
    assert any("torch fold instead" in note and "GiB more" in note for note in elsewhere.notes)
    _on_a_gpu_machine(monkeypatch, "triton")
    here = plan(recipe)
    assert any("triton is not installed on this machine" in note for note in here.notes)
    tokens = recipe.training.micro_batch_size * 2 * recipe.training.max_seq_length  # chosen and rejected stacked
    tiles = CPU_BACKWARD_TILES * min(tokens, TILE_TOKENS) * TILE_VOCAB * 4
    assert _fused_head(here) - _fused_head(elsewhere) == pytest.approx(tiles, rel=0.01)  # the largest of three
    assert here.gpu.total_gib > elsewhere.gpu.total_gib
    _on_a_gpu_machine(monkeypatch)
    assert _fused_head(plan(recipe)) == pytest.approx(_fused_head(elsewhere)), "with triton here: the Triton fold"


def test_flash_attention_is_planned_only_where_it_will_run(monkeypatch):
    recipe = validate_recipe({"model": {"id": "meta-llama/Llama-3.1-8B"}, "method": {"kind": "lora"},
                              "hardware": {"gpus_per_machine": 1, "gpu": "A100-80GB"},
                              "memory": {"attention": "flash", "max_seq_length": 4096}})
    monkeypatch.setattr(kernel_choice, "has_nvidia_gpu", lambda: False)
    assumed = kernel_choice.kernels(recipe, "llama")
    assert assumed.attention == "flash" and any("assumed installed" in note for note in assumed.notes)
    _on_a_gpu_machine(monkeypatch, "flash_attn")
    missing = kernel_choice.kernels(recipe, "llama")
    assert missing.attention == "sdpa" and any("not installed on this machine" in note for note in missing.notes)
    old_gpu = recipe.model_copy(deep=True)
    old_gpu.hardware.gpu = "T4"
    old_gpu.memory.mixed_precision = "fp16"
    old_gpu.model.dtype = "float16"
    _on_a_gpu_machine(monkeypatch)
    assert kernel_choice.kernels(old_gpu, "llama").attention == "sdpa", "flash-attn 2 needs Ampere or newer"
    assert kernel_choice.kernels(recipe, "gemma2").attention == "flash", "Gemma-2 has flash-attention"


def test_liger_is_planned_only_where_it_is_installed(monkeypatch):
    recipe = validate_recipe({"model": {"id": "meta-llama/Llama-3.1-8B"}, "method": {"kind": "lora"},
                              "hardware": {"gpus_per_machine": 1, "gpu": "A100-80GB"}, "memory": {"liger": True}})
    monkeypatch.setattr(kernel_choice, "has_nvidia_gpu", lambda: False)
    assert kernel_choice.kernels(recipe, "llama").liger
    _on_a_gpu_machine(monkeypatch, "liger_kernel")
    chosen = kernel_choice.kernels(recipe, "llama")
    assert not chosen.liger and any("liger-kernel is not installed" in note for note in chosen.notes)


def test_doctor_reports_the_kernels_this_machine_uses_against_the_plans():
    general = check_kernels(None)
    assert general.status == "ok" and "attention:" in general.detail and "trl log-prob fold:" in general.detail
    gemma = check_kernels(load_recipe(builtin_path("gemma2/9b-lora")))
    assert "attention: eager" in gemma.detail
    dpo = check_kernels(load_recipe(builtin_path("llama3.1/8b-lora-dpo")))
    assert dpo.status == "warn" and "the plan assumed the triton fold" in dpo.detail, \
        "this CPU machine has no triton: the GPU plan's Triton fold is not what it would run"
