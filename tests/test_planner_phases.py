"""Every phase of a run is planned (training step, evaluation, saving, resuming, merging, loading), and every device
reports what torch and nvidia-smi would: allocated, reserved and device memory."""
from __future__ import annotations

import json

import pytest

from tuner.catalog.models import model_facts
from tuner.planner import advise, plan
from tuner.planner.items import CUDA_CONTEXT_GIB, GIB, NCCL_GIB
from tuner.recipe.io import validate_recipe
from tuner.recipe.registry import builtin_path

LLAMA_8B, LLAMA_70B = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"


def recipe(model=LLAMA_8B, gpus=8, gpu="H100-80GB", training=None, output=None, data=None, method=None, **memory):
    hardware = {"gpus_per_machine": gpus, "gpu": gpu, **memory.pop("hardware", {})}
    if gpus > 1:
        memory.setdefault("distributed", "ddp")
    return validate_recipe({"model": {"id": model}, "hardware": hardware, "memory": memory, "method": method or {},
                            "training": training or {}, "output": output or {}, "data": data or {}})


def host(memory_plan):
    (device,) = [d for d in memory_plan.devices if d.kind == "host"]
    return device


def test_json_separates_allocated_reserved_and_device_memory():
    data = plan(recipe(max_seq_length=4096)).to_dict()
    gpu = data["devices"][0]
    assert gpu["allocated_gib"] < gpu["reserved_gib"] < gpu["device_gib"] == gpu["total_gib"]
    # reserved - allocated: the caching allocator's segments; device - reserved: what lives outside it
    assert gpu["device_gib"] - gpu["reserved_gib"] == pytest.approx(CUDA_CONTEXT_GIB + NCCL_GIB, abs=0.002)
    levels = {item["level"] for item in gpu["items"]}
    assert levels == {"allocated", "reserved", "device"}
    assert {i["name"] for i in gpu["items"] if i["level"] == "device"} == {"CUDA context and library workspaces",
                                                                             "NCCL communicator buffers"}


def test_cpu_recipes_have_no_allocator_cache(tuner_home):
    from tuner.recipe.io import load_recipe

    cpu = plan(load_recipe(builtin_path("demo"))).devices[0]
    assert cpu.reserved_gib == cpu.allocated_gib < cpu.total_gib


def test_tables_show_the_three_figures_and_every_phase(tuner_cli):
    done = tuner_cli("plan", "--model", LLAMA_8B, "--gpus", "1xH200", "--seq", "8192", "--method", "lora")
    assert done.returncode == 0, done.stderr
    for words in ("torch.cuda.max_memory_allocated", "torch.cuda.max_memory_reserved", "nvidia-smi",
                  "phases: training step", "evaluation", "saving", "loading", "verdict: fits (highest: GPU (H200)"):
        assert words in done.stdout


def test_the_highest_phase_is_named():
    memory_plan = plan(recipe(LLAMA_70B, distributed="deepspeed", zero_stage=3, offload_optimizer="cpu",
                              offload_params="cpu", gradient_checkpointing=True, hardware={"host_ram_gb": 2048}))
    data = memory_plan.to_dict()
    # the offloaded states stay in host RAM while saving gathers the 16-bit weights beside them on rank 0
    assert data["peak"]["device"].startswith("host RAM") and data["peak"]["phase"] == "saving"
    assert set(data["devices"][1]["phases_gib"]) == {"training step", "evaluation", "saving", "resuming", "merging",
                                                      "loading"}
    assert set(data["devices"][0]["phases_gib"]) == {"training step", "evaluation", "saving", "resuming"}


def test_evaluation_builds_the_logits_without_gradients():
    tokens, vocab = 4096, model_facts(LLAMA_8B).vocab_size
    gpu = plan(recipe(gpus=1, max_seq_length=tokens, method={"kind": "lora"})).devices[0]
    (logits,) = [i for i in gpu.items if i.phase == "evaluation" and i.category == "logits_loss"]
    assert logits.bytes == tokens * vocab * (2 + 4 + 4)  # bf16 logits, fp32 upcast, fp32 log-softmax
    assert gpu.phase_gib("evaluation") < gpu.phase_gib("training step")
    no_eval = plan(recipe(gpus=1, max_seq_length=tokens, method={"kind": "lora"}, data={"eval_fraction": 0}))
    assert not [i for i in no_eval.devices[0].items if i.phase == "evaluation"]


@pytest.mark.parametrize("memory, gathered_bytes_per_param", [
    ({"distributed": "deepspeed", "zero_stage": 3}, 2),  # stage3_gather_16bit_weights_on_model_save on rank 0
    ({"distributed": "fsdp"}, 4),  # full state dict of Accelerate's fp32-upcast parameters on rank 0
])
def test_saving_gathers_the_whole_model_in_rank_0_host_ram(memory, gathered_bytes_per_param):
    total = model_facts(LLAMA_70B).total_params
    host_ram = host(plan(recipe(LLAMA_70B, **memory)))
    assert host_ram.phase_gib("saving") == pytest.approx(total * gathered_bytes_per_param / GIB)
    sharded = plan(recipe(LLAMA_70B, distributed="fsdp", fsdp={"state_dict_type": "sharded"}))
    assert host(sharded).phase_gib("saving") == 0


def test_resuming_reads_each_rank_s_optimizer_partition_when_checkpoints_are_saved():
    total = model_facts(LLAMA_8B).total_params
    zero2 = recipe(distributed="deepspeed", zero_stage=2, training={"save_steps": 100})
    per_process = total * 2 + total * 12 / 8  # the 16-bit module states and this rank's optimizer partition
    assert host(plan(zero2)).phase_gib("resuming") == pytest.approx(8 * per_process / GIB)
    never_saved = recipe(distributed="deepspeed", zero_stage=2)
    assert host(plan(never_saved)).phase_gib("resuming") == 0


def test_merging_needs_the_base_and_the_adapter_in_host_ram():
    facts = model_facts(LLAMA_8B)
    merged = plan(recipe(gpus=1, method={"kind": "lora"}, output={"save": "merged"}))
    expected = facts.total_params * 2 + facts.lora_params(16, "all-linear") * 4
    assert host(merged).phase_gib("merging") == pytest.approx(expected / GIB)
    assert host(plan(recipe(gpus=1, method={"kind": "lora"}))).phase_gib("merging") == 0


def test_loading_materialises_the_weights_in_every_process_unless_sharded_loading():
    total = model_facts(LLAMA_8B).total_params
    assert host(plan(recipe())).phase_gib("loading") == pytest.approx(8 * total * 2 / GIB)
    assert host(plan(recipe(distributed="fsdp"))).phase_gib("loading") == pytest.approx(total * 2 / GIB)


def test_a_phase_beyond_the_step_decides_the_verdict_and_the_advisor_names_it():
    """70B on 8 x H200 with ZeRO-3 trains in GPU memory, but saving gathers 130 GiB of 16-bit weights on rank 0."""
    tight_host = recipe(LLAMA_70B, gpu="H200", distributed="deepspeed", zero_stage=3, gradient_checkpointing=True,
                        offload_optimizer="cpu", hardware={"host_ram_gb": 100})
    memory_plan = plan(tight_host)
    assert memory_plan.devices[0].headroom_gib > 0  # the GPUs are fine
    assert memory_plan.verdict == "does not fit" and memory_plan.limiting.kind == "host"
    (advice,) = advise(tight_host)
    assert not advice.fits and "host RAM" in advice.reasons[0] and "hardware.host_ram_gb" in advice.reasons[0]


def test_plan_json_round_trips_through_the_cli(tuner_cli):
    done = tuner_cli("plan", "--model", LLAMA_8B, "--gpus", "2xH100-80GB", "--json")
    data = json.loads(done.stdout)
    assert {"allocated_gib", "reserved_gib", "device_gib", "phases_gib", "peak_phase", "peak_moment"} <= set(
        data["devices"][0])
    assert data["peak"]["device"] == data["devices"][0]["name"]
