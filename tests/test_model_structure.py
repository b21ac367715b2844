"""Every model is planned from its real structure: each MoE and hybrid causal LM of the installed transformers plans
its meta-device count, and a layer kind the planner does not model gives no verdict rather than a guess."""
from __future__ import annotations

import json

import pytest

from tuner.planner import plan
from tuner.recipe.io import validate_recipe


def _moe_or_hybrid_defaults() -> list[str]:
    """model_types of every causal LM class whose default config builds a model with experts, a router, or more
    than one kind of layer (layer_types), read from the installed transformers."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    found = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception:  # a config class whose defaults do not validate
            continue
        text = config
        try:
            text = config.get_text_config()
        except Exception:
            pass
        keys = set(text.to_dict())
        layer_types = set(getattr(text, "layer_types", None) or [])
        if keys & {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"} or len(layer_types) > 1:
            found.append(model_type)
    return found


MOE_OR_HYBRID = _moe_or_hybrid_defaults()


def test_the_installed_transformers_has_the_moe_and_hybrid_classes_the_catalog_plans():
    assert {"qwen3_moe", "qwen3_next", "deepseek_v3", "gpt_oss", "llama4_text", "glm4_moe", "mixtral",
            "qwen3_5_moe"} <= set(MOE_OR_HYBRID)


@pytest.mark.parametrize("model_type", MOE_OR_HYBRID)
def test_every_moe_and_hybrid_class_plans_its_meta_device_count_or_says_what_it_cannot_judge(model_type, tmp_path):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from tuner.catalog.inventory_store import store
    from tuner.catalog.meta_inventory import build_inventory, config_object, meta_model

    config = {**CONFIG_MAPPING[model_type]().to_dict(), "model_type": model_type}
    try:
        model = meta_model(config_object(config, model_type))
    except Exception as exc:  # its defaults do not build (transformers' own bug): nothing to plan
        pytest.skip(f"transformers cannot build {model_type}'s default config: {exc}")
    count = sum(p.numel() for p in model.parameters())  # tied weights once
    store(build_inventory(config, model_type, lora=False, model=model))
    (tmp_path / "config.json").write_text(json.dumps(config))
    recipe = validate_recipe({"model": {"id": str(tmp_path)}, "method": {"kind": "full"},
                              "hardware": {"gpus_per_machine": 1, "gpu": "H200"}})
    memory_plan = plan(recipe)
    assert memory_plan.params["total"] == count
    if memory_plan.unmodelled:
        assert memory_plan.verdict == "cannot judge" and not memory_plan.fits
        assert any(part in memory_plan.notes[0] for part in memory_plan.unmodelled)
    else:
        assert memory_plan.verdict in ("fits", "tight", "does not fit")


@pytest.mark.slow
def test_deepseek_v3_qlora_on_one_141gb_gpu_no_longer_fits(tmp_path, tuner_cli):
    """The reproduction of issue 34: DeepseekV3Config's defaults (671B), QLoRA, one 141 GB GPU, as a user asks.  Its
    experts are fused 3-D parameters bitsandbytes does not quantise, so the 4-bit weights alone are not the story;
    all-linear adapts them, so the ad hoc plan turns LoRA dropout off as PEFT needs."""
    from transformers import DeepseekV3Config

    (tmp_path / "config.json").write_text(json.dumps(DeepseekV3Config().to_dict()))
    result = tuner_cli("plan", "--model", str(tmp_path), "--gpus", "1x141GB", "--method", "qlora", "--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["params"]["total"] == 671_026_404_352
    assert data["verdict"] == "does not fit" and data["missing_gib"] > 1000


def test_qwen3_moe_qlora_on_a_4090_plans_offline_from_the_catalog_without_torch(tuner_cli):
    import os
    import sys

    result = tuner_cli("plan", "--model", "Qwen/Qwen3-30B-A3B", "--gpus", "1xRTX4090", "--method", "qlora", "--json",
                       env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 1, result.stderr  # it does not fit (the experts stay unquantised)
    data = json.loads(result.stdout)
    assert data["params"]["total"] == 30_532_122_624
    assert data["verdict"] == "does not fit"
    code = ("import sys, runpy; sys.argv = ['tuner', 'plan', '--model', 'Qwen/Qwen3-30B-A3B', '--gpus', '1xRTX4090', "
            "'--method', 'qlora', '--json']\ntry:\n    runpy.run_module('tuner', run_name='__main__')\nexcept SystemExit:\n"
            "    pass\nprint('TORCH', 'torch' in sys.modules, file=sys.stderr)\n")
    import subprocess

    from conftest import REPO
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "TORCH False" in probe.stderr


def test_the_advisor_charges_full_sharding_of_a_moe_for_gathering_every_expert():
    """ZeRO-3 on two 40 GB GPUs is what lets both a MoE and a dense model of its size train with LoRA; on the MoE
    it gathers all 128 experts of every layer on each rank, and the advice says what that costs."""
    from tuner.planner.advisor import MOE_FULL_SHARDING_COST, RUNG_COST, advise
    from tuner.recipe.tactics import Rung

    costs = {}
    for model in ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-32B"):
        recipe = validate_recipe({"model": {"id": model}, "method": {"kind": "lora", "lora": {
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}},
            "hardware": {"gpus_per_machine": 2, "gpu": "A100-40GB"},
            "memory": {"distributed": "ddp", "gradient_checkpointing": True, "micro_batch_size": 1}})
        best = advise(recipe, 1)[0]
        assert best.plan.fits and Rung.ZERO3 in best.changes
        costs[model] = best.cost - sum(RUNG_COST[rung] for rung in best.changes)
    assert costs == {"Qwen/Qwen3-30B-A3B": pytest.approx(MOE_FULL_SHARDING_COST), "Qwen/Qwen3-32B": 0}


@pytest.mark.slow
def test_a_full_plan_builds_without_peft_and_a_lora_plan_then_reads_peft_s_expert_names(tmp_path, capsys):
    """A full plan's meta build leaves PEFT unimported (its expert-name tables come with the LoRA counts); a LoRA
    plan of the same inventory, cached by then, still refuses half of a fused expert pair in PEFT's words."""
    import os
    import subprocess
    import sys

    from conftest import REPO
    from tuner.cli import main

    (tmp_path / "config.json").write_text(json.dumps(dict(
        model_type="qwen3_moe", hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128)))
    code = ("import sys\nfrom tuner.cli import main\n"
            f"status = main(['plan', '--model', {str(tmp_path)!r}, '--gpus', '1x80GB', '--method', 'full'])\n"
            "print('STATUS', status, 'PEFT', 'peft' in sys.modules, file=sys.stderr)\n")
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "STATUS 0 PEFT False" in probe.stderr, probe.stderr[-2000:]
    assert main(["plan", "--model", str(tmp_path), "--gpus", "1x80GB", "--method", "lora",
                 "--set", "method.lora.target_modules=[gate_proj]", "--set", "method.lora.dropout=0"]) == 2
    assert "PEFT cannot adapt gate_proj without also targeting up_proj" in capsys.readouterr().err
