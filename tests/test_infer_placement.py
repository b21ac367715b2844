"""Placement arithmetic: memory budgets, KV-cache size, and where layers and bytes are reported."""
from __future__ import annotations

import argparse

import pytest
from rich.console import Console

from tuner.catalog.facts import facts_from_config
from tuner.catalog.models import model_facts
from tuner.commands._types import memory_budget
from tuner.infer.placement import (
    GIB,
    hardware_memory_map,
    kv_cache_bytes,
    max_memory_map,
    placement_table,
    summarise_placement,
)
from tuner.infer.rank_placement import RankShare, TensorParallelPlacement
from tuner.recipe.io import validate_recipe

LLAMA3_8B = model_facts("meta-llama/Llama-3.1-8B")  # the planner's catalog: 32 layers, 8 KV heads of 128


def facts(layers: int, kv_heads: int, head_dim: int):
    config = {"model_type": "llama", "hidden_size": kv_heads * head_dim, "num_attention_heads": kv_heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "num_hidden_layers": layers, "intermediate_size": 8, "vocab_size": 10}
    return facts_from_config(config, "test model", "test")


def test_kv_cache_follows_the_formula():
    # 2 (K and V) * 32 layers * 8 kv heads * 128 dims * 2 bytes (bf16) * 8192 tokens = exactly 1 GiB
    assert kv_cache_bytes(LLAMA3_8B, batch=1, context=8192, bytes_per_value=2) == GIB
    assert kv_cache_bytes(LLAMA3_8B, batch=4, context=8192, bytes_per_value=2) == 4 * GIB
    assert kv_cache_bytes(LLAMA3_8B, batch=1, context=8192, bytes_per_value=2, layers=8) == GIB // 4


def test_kv_cache_from_a_loaded_config_matches_the_catalog():
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32,
                         intermediate_size=14336, vocab_size=128256)
    from_config = facts_from_config(config.to_dict(), "llama", "config")
    assert kv_cache_bytes(from_config, 1, 8192, 2) == kv_cache_bytes(LLAMA3_8B, 1, 8192, 2)


def test_budget_is_gpu_memory_less_headroom_then_cpu_ram():
    budget = max_memory_map([80.0, 80.0], headroom_gib=2.0, cpu_gib=100.0)
    assert budget == {0: 78 * GIB, 1: 78 * GIB, "cpu": 100 * GIB}
    assert max_memory_map([1.0], headroom_gib=2.0, cpu_gib=4.0)[0] == 0


def test_recipe_hardware_sets_the_cpu_budget():
    recipe = validate_recipe({"hardware": {"host_ram_gb": 12}, "inference": {"gpu_headroom_gb": 1}})
    budget, notes = hardware_memory_map(recipe)
    assert budget == {"cpu": 12 * GIB}  # no GPU visible here, and the recipe asks for none
    assert not any("CPU budget" in note for note in notes)


DEVICE_MAP = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu",
              "model.layers.2": "disk", "model.norm": "disk", "lm_head": "cpu"}
TENSORS = {"model.embed_tokens.weight": 100, "model.layers.0.mlp.weight": 1000, "model.layers.1.mlp.weight": 1000,
           "model.layers.2.mlp.weight": 1000, "model.layers.2.attn.bias": 10, "model.norm.weight": 5,
           "lm_head.weight": 100}
LAYERS = ["model.layers.0", "model.layers.1", "model.layers.2"]
SMALL = facts(layers=3, kv_heads=2, head_dim=4)


def test_layers_and_bytes_per_device_with_kv_cache_on_the_main_gpu():
    placement = summarise_placement(DEVICE_MAP, TENSORS, LAYERS, SMALL, bytes_per_value=2, batch=2, context=10,
                                    max_memory={0: 5000, "cpu": 9000})
    assert [row.device for row in placement.devices] == [0, "cpu", "disk"]
    gpu, cpu, disk = placement.devices
    assert (gpu.layers, gpu.weights_bytes, gpu.budget_bytes) == (1, 1100, 5000)
    assert (cpu.layers, cpu.weights_bytes, cpu.budget_bytes) == (1, 1100, 9000)
    assert (disk.layers, disk.weights_bytes, disk.budget_bytes) == (1, 1015, None)
    # offloaded layers compute on GPU 0, so all three layers' keys and values live there
    assert gpu.kv_cache_bytes == kv_cache_bytes(SMALL, 2, 10, 2) == 2 * 3 * 2 * 4 * 2 * 2 * 10
    assert cpu.kv_cache_bytes == disk.kv_cache_bytes == 0
    assert placement.weights_bytes == sum(TENSORS.values())
    warnings = placement.warnings()
    assert any("offloaded to disk" in w and "slow" in w for w in warnings)
    assert any("CPU RAM" in w and "GPU 0" in w for w in warnings)


def test_a_gpu_that_cannot_hold_its_kv_cache_is_flagged():
    placement = summarise_placement({"": 0}, {"model.layers.0.w": 1000}, ["model.layers.0"],
                                    facts(1, 1, 1000), bytes_per_value=2, batch=1, context=100,
                                    max_memory={0: 2000, "cpu": 0}, headroom_bytes=1000)
    [warning] = placement.warnings()
    assert "GPU 0" in warning and "--batch-size" in warning


def test_cpu_only_placement_has_no_warnings_and_renders():
    placement = summarise_placement({"": "cpu"}, TENSORS, LAYERS, SMALL, 4, 1, 16, {"cpu": 10**9})
    assert [row.device for row in placement.devices] == ["cpu"]
    assert placement.warnings() == []
    console = Console(record=True, width=120)
    console.print(placement_table(placement))
    text = console.export_text()
    assert "CPU" in text and "total" in text and "batch 1 × context 16" in text and "model facts: test" in text


def test_tensor_parallel_table_has_a_row_per_rank_and_flags_a_rank_its_gpu_cannot_hold():
    """Llama-3.1-70B in bf16 over 8 GPUs of 80 GB (illustrative: 1/8 of 131.4 GiB of weights and of the KV cache)."""
    rows = tuple(RankShare(rank, f"cuda:{rank}", int(16.43 * GIB), 2_600_000, int(0.32 * GIB), int(77.1 * GIB))
                 for rank in range(8))
    placement = TensorParallelPlacement(rows, 1, 8320, 80, int(2 * GIB), "tuner catalog",
                                        split=("q_proj (colwise)", "o_proj (rowwise)"),
                                        replicated=("input_layernorm", "norm"))
    assert placement.warnings() == []
    console = Console(record=True, width=80)  # stderr that is not a terminal
    console.print(placement_table(placement))
    text = console.export_text()
    assert "Tensor-parallel placement (8 ranks)" in text and "…" not in text
    assert "│ 7 (cuda:7) │  16.43 GiB │    2.5 MiB │ 0.32 GiB │    16.75 GiB │ 77.10 GiB │" in text
    caption = " ".join(text.split("└")[-1].split())
    assert "weights split: q_proj (colwise), o_proj (rowwise); replicated: input_layernorm, norm" in caption
    crowded = TensorParallelPlacement((RankShare(0, "cuda:0", int(78 * GIB), 0, int(2 * GIB), int(77.1 * GIB)),),
                                      1, 8320, 80, int(2 * GIB))
    [warning] = crowded.warnings()
    assert warning.startswith("rank 0 (cuda:0): weights + KV cache (80.00 GiB) exceed the GPU's 79.10 GiB")


def test_max_memory_flags():
    assert [memory_budget(entry) for entry in ("0=20GiB", "CPU=64GiB")] == [(0, "20GiB"), ("cpu", "64GiB")]
    for bad in ("gpu0=20GiB", "cpu", "cpu=lots"):
        with pytest.raises(argparse.ArgumentTypeError, match="DEVICE=SIZE"):
            memory_budget(bad)
