"""The advisor's parallel rungs (tp within a machine, cp/sp for long sequences) and its topology advice."""
from __future__ import annotations

import json

import pytest

from tuner.planner import advise, plan, topology
from tuner.recipe.io import validate_recipe
from tuner.recipe.tactics import Rung


def _recipe(model: str, machines: int = 1, **memory):
    return validate_recipe({
        "model": {"id": model, "dtype": "bfloat16"},
        "hardware": {"machines": machines, "gpus_per_machine": 8, "gpu": "H100-80GB", "host_ram_gb": 2048,
                     **({"main_process_ip": "10.0.0.1"} if machines > 1 else {})},
        "method": {"kind": "full"}, "memory": {"mixed_precision": "bf16", **memory},
    })


def test_a_long_sequence_run_is_advised_to_split_its_sequences():
    """8B full fine-tuning at 64k tokens on 8 GPUs: the activations dominate, and the cheapest fit splits each
    sequence with context parallelism (FSDP's cp), keeping the effective batch."""
    recipe = _recipe("meta-llama/Llama-3.1-8B", distributed="fsdp", attention="sdpa", max_seq_length=65536)
    assert not plan(recipe).fits
    best = advise(recipe)[0]
    assert Rung.CONTEXT_PARALLEL in best.changes and best.fits
    assert best.recipe.parallelism.cp > 1 and best.recipe.memory.distributed == "fsdp"
    assert best.recipe.effective_batch_size == recipe.effective_batch_size
    assert any("parallelism.cp=" in line for line in best.overrides)
    assert any("splits each sequence across" in line for line in best.reasons)


def test_tensor_parallel_within_a_machine_comes_before_offload():
    """Qwen2.5-14B full on 8 GPUs with ZeRO-1: tp 2 (DeepSpeed AutoTP) is the cheapest fit, far ahead of any
    offload; the advised recipe keeps tp within the machine and the effective batch."""
    recipe = _recipe("Qwen/Qwen2.5-14B", distributed="deepspeed", zero_stage=1)
    advice = advise(recipe)
    best = advice[0]
    assert best.changes == [Rung.TENSOR_PARALLEL] and best.recipe.parallelism.tp == 2
    assert best.recipe.effective_batch_size == recipe.effective_batch_size
    offloading = [a for a in advice if Rung.OFFLOAD_OPTIMIZER in a.changes]
    assert all(a.cost > best.cost for a in offloading)


@pytest.mark.slow
def test_70b_full_on_8_a100s_gets_the_topology_beside_the_offload_plans(capsys):
    """The issue's case: every plan on 8 x A100-80GB offloads, so the advice also names the fewest A100s that need
    none — and one machine fewer would not do."""
    from tuner.cli import main

    code = main(["plan", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "8xA100-80GB", "--method", "full",
                 "--advise", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert all("offload_optimizer" in a["changes"] for a in data["advice"])
    more = data["topology"]
    assert more["fits"] and not {"offload_optimizer", "offload_params", "activation_offloading"} & set(more["changes"])
    assert more["reasons"][0].startswith("on 24 GPUs (3 machines x 8 A100-80GB)") and "no offload" in more["reasons"][0]
    assert "hardware.machines=3" in more["set"] and "memory.offload_optimizer=none" not in more["set"]
    assert more["plan"]["devices"][0]["capacity_gib"] >= more["plan"]["devices"][0]["total_gib"]
    on_two = validate_recipe({"model": {"id": "meta-llama/Llama-3.1-70B", "dtype": "bfloat16"},
                              "hardware": {"machines": 2, "gpus_per_machine": 8, "gpu": "A100-80GB",
                                           "main_process_ip": "10.0.0.1"}, "method": {"kind": "full"},
                              "memory": {"distributed": "ddp"}})
    assert topology(on_two).recipe.hardware.machines == 3  # 16 GPUs need offload too

    assert main(["plan", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "8xA100-80GB", "--method", "full",
                 "--advise"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "offload_optimizer" in out and "with more GPUs instead of offload: on 24 GPUs" in out


def test_no_topology_advice_where_the_best_plan_needs_no_offload(capsys):
    from tuner.cli import main

    assert main(["plan", "llama3.1/8b-full-zero3", "--advise", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["topology"] is None


def test_an_sft_recipe_that_sets_the_inert_precompute_flag_is_still_advised():
    """objective.precompute_ref_log_probs means nothing to sft; the advisor once had no candidate left (fuzz)."""
    recipe = validate_recipe({"objective": {"precompute_ref_log_probs": True}, "memory": {"mixed_precision": "no"}})
    plans = advise(recipe)
    assert plans and plans[0].fits
