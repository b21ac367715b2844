"""The analytic planner, the advisor and the ``tuner plan`` command."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tuner.planner import advise, next_step, plan
from tuner.recipe.checks import find_problems
from tuner.recipe.io import validate_recipe
from tuner.recipe.registry import builtin_path

GIB = 2**30


def recipe(model="meta-llama/Llama-3.1-8B", gpus=8, gpu="A100-80GB", **memory):
    method = memory.pop("method", {})
    hardware = {"gpus_per_machine": gpus, "gpu": gpu, **memory.pop("hardware", {})}
    if gpus > 1 and "distributed" not in memory:
        memory["distributed"] = "ddp"
    return validate_recipe({"model": {"id": model}, "hardware": hardware, "memory": memory, "method": method})


def item(memory_plan, words, device=0):
    return sum(i.bytes for i in memory_plan.devices[device].items if words in i.name)


def test_terms_add_up_and_json_names_units():
    p = plan(recipe(max_seq_length=4096, micro_batch_size=2))
    gpu = p.devices[0]
    assert set(gpu.terms) == {"weights", "reference_model", "reward_model", "teacher_model", "lora_adapter", "gradients",
                              "optimizer", "activations", "logits_loss", "generation", "overhead"}
    assert sum(gpu.terms.values()) == pytest.approx(gpu.total_gib)
    assert gpu.headroom_gib == pytest.approx(gpu.capacity_gib - gpu.total_gib)
    data = json.loads(p.to_json())
    assert data["units"]["memory"].startswith("GiB") and data["devices"][0]["terms_gib"]["weights"] > 0


def test_qlora_weights_cost_4_127_bits_plus_unquantised_layers():
    from tuner.catalog.models import model_facts

    facts = model_facts("meta-llama/Llama-3.1-8B")
    p = plan(recipe(gpus=1, method={"kind": "qlora", "quantization": {"bits": 4}}))
    quantised = item(p, "4-bit base weights")
    assert quantised * 8 / facts.quantizable_params() == pytest.approx(4.127, abs=0.001)
    rest = item(p, "unquantised")
    assert rest == (facts.total_params - facts.quantizable_params()) * 4
    lora = item(p, "LoRA adapter")
    assert lora == facts.lora_params(16, "all-linear") * 4


def test_sharding_divides_model_states_by_world_size():
    states = {}
    for stage in (1, 2, 3):
        p = plan(recipe(distributed="deepspeed", zero_stage=stage))
        states[stage] = p.gpu.terms["optimizer"]
    assert states[1] == pytest.approx(states[2]) and states[3] < states[2] * 1.01
    p8 = plan(recipe(distributed="deepspeed", zero_stage=3))
    p16 = plan(recipe(distributed="deepspeed", zero_stage=3, hardware={"machines": 2, "main_process_ip": "10.0.0.1"}))
    assert p16.gpu.terms["optimizer"] == pytest.approx(p8.gpu.terms["optimizer"] / 2)


def test_offload_moves_states_to_host_ram():
    on_gpu = plan(recipe(distributed="deepspeed", zero_stage=3))
    off = plan(recipe(distributed="deepspeed", zero_stage=3, offload_optimizer="cpu", offload_params="cpu",
                      hardware={"host_ram_gb": 512}))
    assert off.gpu.terms["optimizer"] == 0 and off.host_ram_gib > 0
    assert off.devices[1].kind == "host" and off.gpu.total_gib < on_gpu.gpu.total_gib


def test_checkpointing_and_attention_change_activations():
    plain = plan(recipe(gpus=1, max_seq_length=4096, method={"kind": "lora"}))
    ckpt = plan(recipe(gpus=1, max_seq_length=4096, gradient_checkpointing=True, method={"kind": "lora"}))
    eager = plan(recipe(gpus=1, max_seq_length=4096, attention="eager", method={"kind": "lora"}))
    assert ckpt.gpu.terms["activations"] < plain.gpu.terms["activations"] / 5
    assert eager.gpu.terms["activations"] > plain.gpu.terms["activations"] + 32 * 32 * 4096**2 * 6 / GIB * 0.95
    # 128k vocabulary: the logits and loss buffers are 12 bytes per token and vocabulary entry
    assert plain.gpu.terms["logits_loss"] == pytest.approx(4096 * 128256 * 12 / GIB)


def test_cpu_recipe_plans_against_host_ram(tuner_home):
    from tuner.recipe.io import load_recipe

    p = plan(load_recipe(builtin_path("demo")))
    assert p.devices[0].kind == "cpu" and p.verdict in ("fits", "tight") and p.devices[0].capacity_gib > 0


def test_verdicts_and_missing_memory():
    assert plan(recipe("HuggingFaceTB/SmolLM2-135M", gpus=1)).verdict == "fits"
    too_big = plan(recipe("meta-llama/Llama-3.1-70B", gpus=1))
    assert too_big.verdict == "does not fit" and too_big.missing_gib > 500


def test_advice_fits_validates_and_keeps_the_effective_batch():
    r = recipe(max_seq_length=4096, micro_batch_size=4, gradient_accumulation_steps=2)
    advice = advise(r)
    assert advice and all(a.fits for a in advice)
    costs = [a.cost for a in advice]
    assert costs == sorted(costs)
    for a in advice:
        assert find_problems(a.recipe) == []
        assert a.recipe.effective_batch_size >= r.effective_batch_size
        assert a.reasons
    assert advice[0].largest_micro_batch >= 1
    bigger = advice[0].recipe.training.model_copy(update={"micro_batch_size": advice[0].largest_micro_batch + 1})
    assert not plan(advice[0].recipe.model_copy(update={"training": bigger})).fits or advice[0].largest_micro_batch >= 4096


def test_advisor_says_what_is_missing_and_changes_method_only_when_allowed():
    r = recipe("meta-llama/Llama-3.1-405B", gpus=1, gpu="RTX4090", hardware={"host_ram_gb": 512})
    (advice,) = advise(r)  # offloading everything would need terabytes of host RAM
    assert not advice.fits and "GiB missing" in advice.reasons[0] and "allow_method_change" in advice.reasons[0]
    allowed = recipe("meta-llama/Llama-3.1-70B", gpus=1, gpu="RTX4090", max_seq_length=1024,
                     method={"allow_method_change": True})
    kinds = {a.recipe.method.kind for a in advise(allowed)}
    assert kinds <= {"full", "lora", "qlora"}
    assert advise(recipe("meta-llama/Llama-3.1-8B", gpus=1, gpu="RTX4090"))[0].recipe.method.kind == "full"


def test_next_step_follows_the_ladder():
    r = recipe(micro_batch_size=1)
    assert next_step(r).rung == "zero1"
    r = recipe(micro_batch_size=1, distributed="deepspeed", zero_stage=2)
    assert next_step(r).rung == "chunked_loss"
    r = recipe(micro_batch_size=1, distributed="deepspeed", zero_stage=2, chunked_loss=True)
    assert next_step(r).rung == "gradient_checkpointing"
    r = recipe(micro_batch_size=1, distributed="deepspeed", zero_stage=3, gradient_checkpointing=True)
    assert next_step(r).rung == "activation_offloading"  # the chunked loss needs the head unsharded: skipped
    r = recipe(micro_batch_size=1, distributed="deepspeed", zero_stage=3, gradient_checkpointing=True,
               activation_offloading=True)
    assert next_step(r).rung == "offload_optimizer"


def test_planner_import_stays_light():
    code = "import sys, tuner.planner; print(any(m in sys.modules for m in ('torch', 'transformers', 'textual')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_plan_command_adhoc_json_and_errors(tuner_cli):
    done = tuner_cli("plan", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xA100-80GB", "--seq", "4096",
                     "--batch", "2", "--method", "lora", "--gradient-checkpointing", "--zero", "2", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["verdict"] == "fits" and data["devices"][0]["count"] == 8
    done = tuner_cli("plan", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "1xA100-80GB", "--advise")
    assert done.returncode in (0, 1) and "plans that fit" in done.stdout or "nothing fits" in done.stdout
    done = tuner_cli("plan", "--model", "nobody/nothing", "--gpus", "1xL4")
    assert done.returncode == 2 and "model.id" in done.stderr
    done = tuner_cli("plan", "demo", "--set", "training.micro_batch_size=2")
    assert done.returncode == 0 and "verdict" in done.stdout


def test_every_builtin_recipe_gets_a_plan(tuner_home):
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_names, builtin_path, planned_as

    for name in builtin_names():
        recipe = planned_as(load_recipe(builtin_path(name)))  # demo-dpo starts from demo's result: demo's model
        assert plan(recipe).verdict in ("fits", "tight", "does not fit")


def test_plan_simulate_reports_the_traced_peak(tuner_home, capsys):
    from tuner.cli import main

    assert main(["plan", "demo", "--simulate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    simulated = data["simulation"]["peak_gib"]
    assert data["simulation"]["error"] is None
    assert data["simulation"]["planned_gib"] == pytest.approx(simulated, rel=0.15)
