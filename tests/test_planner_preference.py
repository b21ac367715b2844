"""Planning preference training (dpo, kto): the reference model as its own term, the doubled batch, the precompute
pass, the advisor's rungs, and the shipped real-model DPO recipes."""
from __future__ import annotations

import pytest

from tuner.planner import advise, next_step, plan
from tuner.planner.items import AFTER_LOADING, ALWAYS
from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.registry import builtin_path

GIB = 2**30


def recipe(objective="dpo", method="full", gpus=8, gpu="A100-80GB", precompute=False, **memory):
    hardware = {"gpus_per_machine": gpus, "gpu": gpu}
    if gpus > 1 and "distributed" not in memory:
        memory["distributed"] = "ddp"
    method_section = {"kind": method, **({"quantization": {"bits": 4}} if method == "qlora" else {}),
                      "allow_method_change": memory.pop("allow_method_change", False)}
    return validate_recipe({"model": {"id": "meta-llama/Llama-3.1-8B"}, "hardware": hardware, "memory": memory,
                            "method": method_section,
                            "objective": {"kind": objective, "precompute_ref_log_probs": precompute}})


def term(memory_plan, category, device=0) -> float:
    return sum(i.bytes for i in memory_plan.devices[device].items if i.category == category)


def resident_weights(memory_plan, device=0) -> float:
    """The policy's weights that stay on the device all step (not ZeRO-3's gathered working modules)."""
    return sum(i.bytes for i in memory_plan.devices[device].items  # host RAM holds them once loading is over
               if i.category == "weights" and i.phase in (ALWAYS, AFTER_LOADING) and "gathered" not in i.name)


@pytest.mark.parametrize("memory", [dict(), dict(distributed="deepspeed", zero_stage=1),
                                    dict(distributed="deepspeed", zero_stage=2),
                                    dict(distributed="deepspeed", zero_stage=3),
                                    dict(distributed="deepspeed", zero_stage=3, offload_params="cpu",
                                         offload_optimizer="cpu")],
                         ids=["ddp", "zero1", "zero2", "zero3", "zero3-offload"])
def test_full_dpo_reference_equals_the_policys_weights_per_rank(memory):
    p = plan(recipe(**memory))
    for device in range(len(p.devices)):
        assert term(p, "reference_model", device) == resident_weights(p, device)
    assert term(p, "reference_model") + term(p, "reference_model", -1) > 0
    if memory.get("zero_stage") == 3:  # sharded like the policy (host RAM: the 8 GPUs' shards of one machine)
        offloaded = "offload_params" in memory
        assert term(p, "reference_model", int(offloaded)) == pytest.approx(2 * p.params["total"] / (1 if offloaded else 8))
    sft = plan(recipe(objective="sft", **memory))
    assert term(sft, "reference_model") == 0


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_lora_is_its_own_reference(method):
    p = plan(recipe(method=method, gpus=1, gpu="RTX4090"))
    assert all(term(p, "reference_model", d) == 0 for d in range(len(p.devices)))
    assert "reference_model" in p.devices[0].terms  # the term is always there, at zero


def test_fsdp_reference_is_a_shard_in_the_models_dtype_gathered_whole_for_its_forward():
    p = plan(recipe(distributed="fsdp"))
    items = {i.name: i for i in p.devices[0].items if i.category == "reference_model"}
    shard = next(i for name, i in items.items() if "FSDP shard 1/8" in name)
    gathered = next(i for name, i in items.items() if "gathered whole" in name)
    assert shard.bytes == pytest.approx(2 * p.params["total"] / 8) and shard.phase == "always"
    assert gathered.bytes == pytest.approx(2 * p.params["total"]) and gathered.phase == "loss"


def test_precomputed_reference_keeps_no_copy_and_plans_its_own_pass():
    live = plan(recipe(gpus=1, gpu="H200"))
    pre = plan(recipe(gpus=1, gpu="H200", precompute=True))
    assert term(pre, "reference_model") == 0
    assert live.gpu.total_gib - pre.gpu.total_gib == pytest.approx(term(live, "reference_model") / GIB, rel=0.05)
    passes = [d for d in pre.devices if d.kind == "pass"]
    assert len(passes) == 1 and "reference log-prob pass before training" in passes[0].name
    assert 0 < passes[0].total_gib < pre.gpu.total_gib and passes[0].capacity_gib == pre.gpu.capacity_gib
    assert pre.to_dict()["devices"][-1]["kind"] == "pass"


def test_dpo_puts_chosen_and_rejected_through_one_forward():
    dpo = plan(recipe(gpus=1, gpu="H200", micro_batch_size=2, max_seq_length=1024))
    sft = plan(recipe(objective="sft", gpus=1, gpu="H200", micro_batch_size=4, max_seq_length=1024))
    saved = lambda p: sum(i.bytes for i in p.gpu.items if i.category == "activations" and i.phase not in ("layer backward", "evaluation"))  # noqa: E731
    assert saved(dpo) == saved(sft)  # 2 pairs = 4 sequences
    kto = plan(recipe(objective="kto", gpus=1, gpu="H200", micro_batch_size=4, max_seq_length=1024))
    assert saved(kto) == saved(sft)
    assert dpo.micro_batch_size == 2  # the plan reports the recipe's micro-batch of pairs


def test_fused_head_replaces_the_logits_buffers():
    dpo = plan(recipe(gpus=1, gpu="H200", micro_batch_size=4, max_seq_length=4096))
    sft = plan(recipe(objective="sft", gpus=1, gpu="H200", micro_batch_size=8, max_seq_length=4096))
    assert {i.source for i in dpo.gpu.items if i.category == "logits_loss"} == {"trl-fused-head"}  # step and eval
    assert not any("logits segment" in i.name for i in dpo.gpu.items)
    # 32k tokens x 128k vocabulary: SFT's fp32 logits buffers (~47 GiB) against 4096 x 32768 tiles and the head's
    # fp32 weight gradient (~2 GiB)
    assert term(dpo, "logits_loss") < 3 * GIB < 40 * GIB < term(sft, "logits_loss")


def test_advisor_drops_the_reference_copy_first_and_says_lora_is_its_own_reference():
    full = recipe(gpus=1, gpu="56GB", gradient_checkpointing=True, max_seq_length=1024, optimizer="adamw_8bit")
    assert not plan(full).fits
    best = advise(full)[0]
    assert best.fits and best.changes[0] == "precompute_reference"
    assert best.recipe.objective.precompute_ref_log_probs is True
    assert any("no frozen copy of the model stays beside it" in reason for reason in best.reasons)
    assert next_step(full).rung == "precompute_reference"
    assert next_step(full).overrides == ["objective.precompute_ref_log_probs=true"]
    assert next_step(best.recipe).rung != "precompute_reference"

    tight = recipe(gpus=1, gpu="RTX4090", max_seq_length=1024, allow_method_change=True)
    lora = next(a for a in advise(tight) if "lora" in a.changes)
    assert "with LoRA the reference is the model with its adapter disabled: no frozen copy" in lora.reasons


def test_oom_advice_for_full_dpo_is_to_precompute_the_reference():
    from tuner.train.oom import out_of_memory_advice

    rung, message = out_of_memory_advice(recipe(gpus=1, gpu="H200"), "dpo.yaml")
    assert rung == "precompute_reference"
    assert "--set objective.precompute_ref_log_probs=true --resume" in message


@pytest.mark.parametrize("name", ["llama3.1/8b-lora-dpo", "llama3.1/8b-full-zero3-dpo"])
def test_shipped_dpo_recipes_fit_their_hardware(name):
    memory_plan = plan(load_recipe(builtin_path(name)))
    assert memory_plan.verdict == "fits", memory_plan.to_json()
    full = "full" in name
    assert (term(memory_plan, "reference_model") > 0) == full
