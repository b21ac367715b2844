"""Per-rank memory with tensor, context and sequence parallelism, held to hand counts and published accounting.

No multi-GPU parallel run can be measured here (docs/memory.md says so): the weights are counted by hand from the
model's config, the activations against Korthikanti et al. 2022's split (only the attention core and the MLP's
intermediates divide by tp), the sequence terms against the cp/sp degree.
"""
from __future__ import annotations

import pytest

from tuner.catalog.models import model_facts
from tuner.planner import plan
from tuner.planner.memory import rank_model_states
from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.registry import builtin_path

# Llama 3.1 70B's config: hidden 8192, 80 layers, 64 heads of 128, 8 KV heads, MLP 28672, vocab 128256, untied
H, LAYERS, Q, KV, MLP, VOCAB = 8192, 80, 64 * 128, 8 * 128, 28672, 128256
LAYER_LINEARS = LAYERS * (H * Q + 2 * H * KV + Q * H + 3 * H * MLP)
NORMS = (2 * LAYERS + 1) * H


def _recipe(model="meta-llama/Llama-3.1-70B", machines=2, memory=None, parallelism=None, **hardware):
    return validate_recipe({
        "model": {"id": model, "dtype": "bfloat16"},
        "hardware": {"machines": machines, "gpus_per_machine": 8, "gpu": "H100-80GB", "host_ram_gb": 2048,
                     **({"main_process_ip": "10.0.0.1"} if machines > 1 else {}), **hardware},
        "method": {"kind": "full"}, "parallelism": parallelism or {},
        "memory": {"mixed_precision": "bf16", "gradient_checkpointing": True, **(memory or {})},
    })


def _item(memory_plan, start: str):
    return next(i for i in memory_plan.gpu.items if i.name.startswith(start))


def test_fsdp_tensor_parallel_splits_the_layers_and_an_untied_head_and_keeps_the_embeddings_whole():
    """transformers' plan: the layers' linears and lm_head split by tp, embeddings and norms whole, then FSDP shards
    the rank's share over dp_shard; the table says both."""
    recipe = _recipe(memory={"distributed": "fsdp", "mixed_precision": "no"}, parallelism={"tp": 8, "dp_shard": 2})
    weights = _item(plan(recipe), "parameters (FSDP shard)")
    per_rank = LAYER_LINEARS / 8 + VOCAB * H + VOCAB * H / 8 + NORMS
    assert weights.bytes == pytest.approx(per_rank * 2 / 2, abs=64)
    assert "(tp 1/8)" in weights.name and "(shard 1/2)" in weights.name


def test_autotp_splits_the_head_but_not_an_untied_embedding_and_zero_shards_over_the_other_ranks():
    """DeepSpeed AutoTP splits the output head by vocabulary and leaves Llama 8B's untied input embedding whole (as
    the traced ranks of tests/test_rank_memory.py hold it); ZeRO partitions over world / tp = 2 ranks."""
    recipe = _recipe(memory={"distributed": "deepspeed", "zero_stage": 1}, parallelism={"tp": 8})
    memory_plan = plan(recipe)
    per_rank = LAYER_LINEARS / 8 + VOCAB * H / 8 + VOCAB * H + NORMS
    assert _item(memory_plan, "16-bit parameters (tp 1/8)").bytes == pytest.approx(per_rank * 2, abs=64)
    assert _item(memory_plan, "Adam moments (fp32) (ZeRO 1/2) (tp 1/8)").bytes == pytest.approx(per_rank * 8 / 2, abs=64)


def test_tensor_parallel_splits_only_the_attention_and_mlp_activations():
    """Korthikanti et al. 2022 (eq. 2): with tp t a layer keeps sbh(10 + 24/t + ...): the norms' inputs, the first
    linears' inputs and the residual stay whole.  For tuner's accounting of Llama 8B full fine-tuning (flash
    attention, bf16) the whole part per token and layer is 2 norms x (4h + 2h) + 2h (q/k/v input) + 2h (MLP input)."""
    def saved(tp: int) -> float:
        recipe = _recipe(model="meta-llama/Llama-3.1-8B", machines=1, parallelism={"tp": tp},
                         memory={"distributed": "deepspeed", "zero_stage": 1, "gradient_checkpointing": False,
                                 "attention": "flash", "max_seq_length": 4096})
        item = _item(plan(recipe), "saved activations")
        assert tp == 1 or f"attention and MLP tp 1/{tp}" in item.name
        return item.bytes

    h, tokens, layers = 4096, 4096, 32
    whole = 2 * saved(2) - saved(1)  # saved(t) = whole + split / t
    assert whole == pytest.approx(layers * tokens * (2 * (4 * h + 2 * h) + 2 * h + 2 * h))
    assert saved(8) == pytest.approx(whole + (saved(1) - whole) / 8)


@pytest.mark.parametrize("split", [{"cp": 4}, {"sp": 4}])
def test_splitting_the_sequence_divides_every_token_term_and_adds_its_exchange_buffers(split):
    """cp (ring attention, fsdp) and sp (Ulysses, deepspeed) give each rank s/4 tokens of every sequence; neither
    keeps sdpa's s x s mask; cp gathers one layer's K and V of the whole sequence, sp all-to-alls q, k, v, out."""
    backend = {"distributed": "fsdp"} if "cp" in split else {"distributed": "deepspeed", "zero_stage": 3}
    memory = {**backend, "attention": "sdpa", "max_seq_length": 65536}
    whole, shared = (plan(_recipe(model="meta-llama/Llama-3.1-8B", machines=1, memory=memory, parallelism=p))
                     for p in ({}, split))
    inputs = _item(shared, "checkpointed layer inputs")
    assert inputs.bytes == _item(whole, "checkpointed layer inputs").bytes / 4
    assert f"sequence 1/4 by {next(iter(split))}" in inputs.name
    logits = _item(shared, "logits and cross-entropy")
    assert logits.bytes == _item(whole, "logits and cross-entropy").bytes / 4
    f = model_facts("meta-llama/Llama-3.1-8B")
    if "cp" in split:
        ring = _item(shared, "context-parallel K and V of the whole sequence")
        assert ring.bytes == 65536 * 2 * f.kv_dim * (2 + 4)
    else:
        exchange = _item(shared, "Ulysses all-to-all buffers")
        assert exchange.bytes == 65536 / 4 * (2 * f.q_dim + 2 * f.kv_dim) * 2
    # the recomputed layer drops sdpa's 65536-wide mask row per token: more than the 1/4 of the tokens alone
    recomputed = _item(shared, "one layer recomputed").bytes
    assert recomputed < _item(whole, "one layer recomputed").bytes / 4


def test_rank_model_states_are_the_plans_items_for_a_trace_to_compare():
    """The function the 2-rank AutoTP trace compares with: the demo model's (tied) weights halved by tp 2,
    norms whole, and no ZeRO sharding left (world 2 / tp 2 = 1 data-parallel rank)."""
    def recipe(tp: int):
        return load_recipe(builtin_path("demo"), ["hardware.num_processes=2", "memory.distributed=deepspeed",
                                                  "memory.zero_stage=1", f"parallelism.tp={tp}"])

    counts = model_facts("builtin:demo").param_counts
    rank_params = (counts.total - counts.norms) / 2 + counts.norms
    states = rank_model_states(recipe(2))
    assert states["weights"] == pytest.approx(rank_params * 4, abs=8)  # fp32 on the CPU
    assert states["gradients"] == pytest.approx(rank_params * 4, abs=8)  # the fp32 gradients for the step
    assert rank_model_states(recipe(1))["weights"] == counts.total * 4


def test_plan_shows_the_split_per_rank(capsys):
    """What `tuner plan` shows of each rank's share: the tp and FSDP splits in the table, the sequence split and the
    ring buffers among the items of --json."""
    import json

    from tuner.cli import main

    assert main(["plan", "llama3.1/70b-full-tp"]) == 0
    table = capsys.readouterr().out
    assert "(tp 1/8)" in table and "(shard 1/2)" in table and "GPU (16 x H100-80GB)" in table
    assert main(["plan", "llama3.1/8b-full-64k-cp", "--json"]) == 0
    names = [item["name"] for item in json.loads(capsys.readouterr().out)["devices"][0]["items"]]
    assert "checkpointed layer inputs (32 layers, sequence 1/4 by cp)" in names
    assert any(name.startswith("context-parallel K and V of the whole sequence") for name in names)
