"""Model facts: every catalog entry's parameter counts equal a real (meta-device) transformers model's."""
from __future__ import annotations

import json

import pytest

from tuner.catalog.models import (UnknownModelError, _catalog, catalog_ids, facts_from_config, model_facts)

# Published totals (model cards / safetensors metadata) as an independent check of the catalog values.
PUBLISHED_TOTALS = {
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.1-70B": 70_553_706_496,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "google/gemma-2-2b": 2_614_341_888,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    "HuggingFaceTB/SmolLM2-135M": 134_515_008,
}


def _category(name: str) -> str:
    if "embed_tokens" in name:
        return "embeddings"
    if "lm_head" in name:
        return "lm_head"
    if ".self_attn." in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    if "norm" in name:
        return "norms"
    raise AssertionError(f"unclassified parameter {name}")


def _meta_model(config_dict: dict):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("model_id", catalog_ids())
def test_catalog_counts_match_a_meta_device_model(model_id):
    facts = model_facts(model_id)
    model = _meta_model(_catalog()[model_id])
    counts = dict.fromkeys(["embeddings", "attention", "mlp", "norms", "lm_head"], 0)
    for name, param in model.named_parameters():  # tied weights are listed once
        counts[_category(name)] += param.numel()
    expected = facts.param_counts.as_dict()
    assert {**counts, "total": sum(counts.values())} == expected
    if model_id in PUBLISHED_TOTALS:
        assert expected["total"] == PUBLISHED_TOTALS[model_id]


def _small(model_type: str, **extra) -> dict:
    return dict(model_type=model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=128, **extra)


SMALL = {
    "llama": _small("llama"),
    "qwen2": _small("qwen2"),
    "phi3": _small("phi3", pad_token_id=0),
    "gemma2": _small("gemma2", head_dim=32),
    "mixtral": _small("mixtral", num_local_experts=4, eos_token_id=1),
    "qwen3": _small("qwen3", head_dim=24),
}


@pytest.mark.parametrize("arch", list(SMALL))
@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"], ["o_proj", "down_proj"]])
def test_lora_counts_match_peft(arch, targets):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    facts = facts_from_config(SMALL[arch], arch, "test")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**SMALL[arch]))
    assert sum(p.numel() for p in model.parameters()) == facts.total_params
    expected = facts.lora_params(8, targets)
    if expected == 0:  # PEFT refuses a config that matches nothing
        return
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=targets, task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert trainable == expected


def test_local_directory_and_aliases(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_catalog()["Qwen/Qwen2.5-7B"]))
    local = model_facts(str(tmp_path))
    assert local.total_params == model_facts("Qwen/Qwen2.5-7B").total_params
    assert "config.json" in local.source
    assert model_facts("meta-llama/Llama-3.1-8B-Instruct").total_params == 8_030_261_248
    assert model_facts("qwen2.5-0.5b").hidden_size == 896


def test_builtin_demo_matches_the_built_model(demo_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model_path)
    assert model_facts.__wrapped__("builtin:demo").total_params == sum(p.numel() for p in model.parameters())


def test_unknown_model_says_what_to_do(tmp_path):
    with pytest.raises(UnknownModelError, match="catalog"):
        model_facts("nobody/no-such-model-xyz")
    with pytest.raises(UnknownModelError, match="no config.json"):
        model_facts(str(tmp_path))
    with pytest.raises(UnknownModelError, match="no such directory; .* a finished run's final/ or merged/"):
        model_facts("runs/not-trained-yet/final")
