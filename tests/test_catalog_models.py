"""Model facts come from the real module tree: every catalog entry's shipped inventory is what the meta device builds
now, its total is the count its authors publish, and LoRA counts are PEFT's own on the meta model."""
from __future__ import annotations

import json
import re

import pytest

from tuner.catalog.inventory import config_key, shipped_path
from tuner.catalog.facts import facts_from_config
from tuner.catalog.model_config import UnknownModelError
from tuner.catalog.models import _catalog, catalog_config, catalog_ids, demo_config, model_facts

# Where a published count and the module tree transformers builds cannot agree to 0.5%, and why (the test holds the
# deviation to what is written here, so a wrong transcription still fails).
KNOWN_DEVIATIONS = {
    "zai-org/GLM-4.5": (-0.0062, "the card's 355B is rounded and counts the multi-token-prediction layer, which "
                                 "transformers does not build"),
    "zai-org/GLM-4.6": (-0.0062, "as GLM-4.5"),
    "zai-org/GLM-4.5-Air": (+0.0081, "the card's 106B is rounded to three figures"),
    "Qwen/Qwen3.5-35B-A3B": (-0.0097, "35B is the checkpoint's rounded name"),
}


def _count(text: str) -> tuple[float, float]:
    """('30.5B') -> (30.5e9, 0.05e9): a published count and half its last digit (how precisely it is given)."""
    number = text.replace(",", "")
    match = re.fullmatch(r"([0-9.]+)([BM]?)", number)
    assert match, text
    digits, unit = match.groups()
    scale = {"B": 1e9, "M": 1e6, "": 1}[unit]
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return float(digits) * scale, 0.5 * 10 ** -decimals * scale


@pytest.mark.parametrize("model_id", catalog_ids())
def test_every_catalog_entry_cites_its_source_and_totals_its_published_count(model_id):
    entry = _catalog()[model_id]
    assert entry["_source"].startswith(("https://huggingface.co/", "transformers 5.24", "text_config of https://"))
    facts = model_facts(model_id)
    assert facts.total_params == facts.inventory.total > 0
    published = entry.get("_published")
    if published is None:
        return
    count, rounding = _count(published["total"])
    error = facts.total_params / count - 1
    if model_id in KNOWN_DEVIATIONS:
        expected, _ = KNOWN_DEVIATIONS[model_id]
        assert error == pytest.approx(expected, abs=0.0005)
    else:
        assert abs(facts.total_params - count) <= max(0.005 * count, rounding), (error, published)
    if "non_embedding" in published:  # Qwen3's cards give both
        embeddings = facts.param_counts.embeddings + facts.param_counts.lm_head
        non_embedding, rounding = _count(published["non_embedding"])
        assert abs(facts.total_params - embeddings - non_embedding) <= max(0.005 * non_embedding, rounding)


def _meta_groups(config: dict):
    from tuner.catalog.meta_inventory import build_inventory

    return build_inventory(config, "test", lora=False)


@pytest.mark.slow
@pytest.mark.parametrize("model_id", ["builtin:demo", *catalog_ids()])
def test_shipped_inventories_are_what_the_meta_device_builds_now(model_id):
    """The inventories planning reads without torch hold exactly the groups a fresh meta-device build records
    (`make inventories` rewrites them after a catalog change or a transformers upgrade)."""
    config = demo_config() if model_id == "builtin:demo" else catalog_config(model_id)
    shipped = json.loads(shipped_path(config_key(config)).read_text())
    fresh = _meta_groups(config)
    structure = ("pattern", "module", "kind", "params", "layers", "instances", "quantized", "attrs")
    assert [{key: group[key] for key in structure} for group in shipped["groups"]] == \
        [{key: getattr(group, key) for key in structure} for group in fresh.groups]
    assert (shipped["architecture"], shipped["layer_types"], shipped["tied"]) == \
        (fresh.architecture, fresh.layer_types, fresh.tied)


def _small(model_type: str, **extra) -> dict:
    return {**dict(model_type=model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128), **extra}


SMALL = {
    "llama": _small("llama"),
    "qwen2": _small("qwen2"),
    "phi3": _small("phi3", pad_token_id=0),
    "gemma2": _small("gemma2", head_dim=32),
    "mixtral": _small("mixtral", num_local_experts=4, eos_token_id=1),
    "qwen3": _small("qwen3", head_dim=24),
    "qwen3_moe": _small("qwen3_moe", head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
    "deepseek_v3": _small("deepseek_v3", num_hidden_layers=3, num_key_value_heads=4, moe_intermediate_size=32,
                          n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                          q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                          n_group=2, topk_group=1),
    "qwen3_next": _small("qwen3_next", num_hidden_layers=4, head_dim=16, moe_intermediate_size=32, num_experts=4,
                         num_experts_per_tok=2, shared_expert_intermediate_size=32, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16),
    "gpt_oss": _small("gpt_oss", intermediate_size=32, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                      sliding_window=16),
    "llama4_text": _small("llama4_text", num_hidden_layers=4, head_dim=16, intermediate_size_mlp=96,
                          num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2),
    "glm4_moe": _small("glm4_moe", num_hidden_layers=3, head_dim=16, moe_intermediate_size=32, n_routed_experts=4,
                       num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1),
}
TARGETS = ["all-linear", ["q_proj", "v_proj"], ["o_proj", "down_proj"], ["gate_proj", "up_proj", "down_proj"]]


def _peft_trainable(config: dict, **lora) -> int | str:
    import torch
    from peft import LoraConfig, get_peft_model

    from tuner.catalog.meta_inventory import config_object, meta_model, unadaptable_linears

    model = meta_model(config_object(config, "test"))
    try:  # as training wraps it: no adapter on a linear whose forward returns more than its map (Llama 4's router)
        with torch.device("meta"):
            excluded = sorted(unadaptable_linears(model)) or None
            wrapped = get_peft_model(model, LoraConfig(r=8, task_type="CAUSAL_LM", exclude_modules=excluded, **lora))
    except ValueError as exc:
        return str(exc)
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


@pytest.mark.parametrize("arch", list(SMALL))
def test_lora_counts_equal_peft_on_the_meta_model(arch):
    """Every target spec a recipe can write (names, all-linear, v4 expert names PEFT renames into the fused
    experts, target_parameters), counted from the inventory, against get_peft_model on the same meta model."""
    facts = facts_from_config(SMALL[arch], arch, "test")
    specs = [(targets, ()) for targets in TARGETS]
    if facts.is_moe:
        specs.append(([], ("experts.gate_up_proj", "experts.down_proj")))
        specs.append((["q_proj"], ("mlp.experts.down_proj",)))
    for targets, parameters in specs:
        expected = _peft_trainable(SMALL[arch], target_modules=targets, target_parameters=list(parameters) or None)
        resolved = facts.peft_targets(targets, parameters)
        if isinstance(expected, str):  # PEFT refuses it (matches nothing, or half a fused pair)
            assert resolved.refusal or facts.lora_params(8, targets, parameters) == 0, (targets, expected)
            continue
        assert resolved.refusal is None
        assert facts.lora_params(8, targets, parameters) == expected, (targets, parameters)


def test_local_directory_and_aliases(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(catalog_config("Qwen/Qwen2.5-7B")))
    local = model_facts(str(tmp_path))
    assert local.total_params == model_facts("Qwen/Qwen2.5-7B").total_params
    assert "config.json" in local.source
    assert model_facts("meta-llama/Llama-3.1-8B-Instruct").total_params == 8_030_261_248
    assert model_facts("qwen2.5-0.5b").hidden_size == 896
    assert model_facts("deepseek-ai/DeepSeek-R1").inventory_key == model_facts("deepseek-ai/DeepSeek-V3").inventory_key
    assert model_facts("google/gemma-3-4b-it").source.endswith("(google/gemma-3-4b-pt)")


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
