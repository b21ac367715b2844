"""A recipe that validates also loads: `tuner validate` refuses, in the libraries' own words, what transformers and
PEFT refuse when the model is built or wrapped, and every built-in recipe's model builds with tuner's loader (its
real class on the meta device, the attention it loads with, bitsandbytes' layers, PEFT's adapters)."""
from __future__ import annotations

import json
import shutil

import pytest

from tuner.catalog import model_classes
from tuner.cli import main
from tuner.loading.model import build_on_meta, choose_attention
from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.registry import builtin_names, builtin_path, planned_as, recipes_dir
from tuner.recipe.schema import Recipe
from tuner.recipe.source import RecipeError

MIXTRAL_LORA = {"model": {"id": "mistralai/Mixtral-8x7B-v0.1"}, "method": {"kind": "lora"}}  # default dropout 0.05


def test_the_shipped_table_is_what_the_installed_transformers_says():
    shipped = model_classes.TABLE_FILE.read_text()
    assert json.loads(shipped)["transformers_version"] == model_classes.installed_transformers_version()
    assert model_classes.table_text(model_classes.generate_table()) == shipped, \
        "regenerate it: python -m tuner.catalog.model_classes --write"


@pytest.mark.parametrize("name", builtin_names())
def test_every_builtin_recipe_builds_its_model_with_tuners_loader(name):
    recipe = planned_as(load_recipe(builtin_path(name)))
    model = build_on_meta(recipe)
    attention, _ = choose_attention(recipe.memory.attention, model.config.model_type)
    assert model.config._attn_implementation == attention
    if recipe.method.kind != "full":
        assert any(p.requires_grad for p in model.parameters()), "PEFT's adapters are on"


def _library_refusal(data: dict) -> str:
    """What the libraries raise when the recipe's model is built without tuner's checks (schema only)."""
    with pytest.raises(ValueError) as raised:
        build_on_meta(Recipe.model_validate(data))
    return " ".join(str(raised.value).split())


def test_sdpa_on_gemma2_is_refused_at_validate_in_transformers_words():
    data = {"model": {"id": "google/gemma-2-9b-it"}, "method": {"kind": "lora"}, "memory": {"attention": "sdpa"}}
    with pytest.raises(RecipeError) as refused:
        validate_recipe(data)
    message = str(refused.value)
    assert "memory.attention" in message and "Gemma2ForCausalLM" in message and "attention: eager" in message
    quoted = message.split('"')[1]
    assert quoted.rstrip(".") in _library_refusal(data), "the reason quoted is the one transformers raises"


def test_lora_dropout_on_fused_moe_experts_is_refused_at_validate_in_peft_words():
    with pytest.raises(RecipeError) as refused:
        validate_recipe(MIXTRAL_LORA)
    message = str(refused.value)
    assert "method.lora.dropout" in message and "dropout: 0" in message
    assert message.split('"')[1] == _library_refusal(MIXTRAL_LORA)
    fixed = validate_recipe({**MIXTRAL_LORA, "method": {"kind": "lora", "lora": {"dropout": 0}}})
    build_on_meta(fixed)  # and what validate then accepts builds
    named = validate_recipe({**MIXTRAL_LORA, "method": {"kind": "lora", "lora": {"target_modules": ["q_proj"]}}})
    build_on_meta(named)  # dropout is fine on nn.Linear targets


def test_auto_attention_loads_gemma2_with_eager_and_plans_it():
    from tuner.planner import plan
    from tuner.planner.rank_setup import rank_setup

    recipe = load_recipe(builtin_path("gemma2/9b-lora"))
    assert recipe.memory.attention == "auto"
    assert build_on_meta(recipe).config._attn_implementation == "eager"
    assert rank_setup(recipe).eager, "the plan counts the eager path the run takes"
    assert any("planned as eager" in note for note in plan(recipe).notes)
    assert not rank_setup(load_recipe(builtin_path("llama3.1/8b-lora"))).eager


def test_recipes_check_builds_each_model_and_names_the_one_that_does_not(tmp_path, monkeypatch, capsys):
    """A table that says Gemma-2 has sdpa (a stale one) lets validate pass; building the model still catches it."""
    library = tmp_path / "recipes"
    shutil.copytree(recipes_dir(), library)
    monkeypatch.setenv("TUNER_RECIPES_DIR", str(library))
    for name in builtin_names():
        if not name.startswith("gemma2/"):
            (library / f"{name}.yaml").unlink()
    path = library / "gemma2" / "9b-lora.yaml"
    path.write_text(path.read_text().replace("attention: auto", "attention: sdpa"))
    stale = model_classes.model_class("gemma2")
    model_classes.model_class.cache_clear()
    monkeypatch.setattr(model_classes, "model_class",
                        lambda model_type: stale.__class__(**{**stale.__dict__, "sdpa": True}))
    assert main(["recipes", "check"]) == 1
    err = capsys.readouterr().err
    assert "9b-lora.yaml: validates, but its model does not build" in err and "scaled_dot_product_attention" in err


def test_the_chunked_loss_on_a_soft_capping_model_is_refused_at_validate():
    data = {"model": {"id": "google/gemma-2-9b-it"}, "method": {"kind": "lora"}, "memory": {"chunked_loss": True}}
    with pytest.raises(RecipeError) as refused:
        validate_recipe(data)
    assert "memory.chunked_loss" in str(refused.value) and "soft-caps its logits" in str(refused.value)


def test_modules_to_save_on_a_quantised_layer_is_refused_at_validate_in_torchs_words(demo_model_path):
    """A full copy of a layer bitsandbytes quantised cannot train: PEFT's wrap fails in torch's words on a real
    4-bit load (the meta build does not quantise, so only validate and the real load see it)."""
    from tuner.loading.model import load_model, trainable_model

    def qlora(modules_to_save: list[str]) -> dict:
        return {"model": {"id": str(demo_model_path), "dtype": "float32"},
                "method": {"kind": "qlora", "quantization": {"bits": 4},
                           "lora": {"target_modules": ["q_proj"], "modules_to_save": modules_to_save}}}

    with pytest.raises(RecipeError) as refused:
        validate_recipe(qlora(["o_proj"]))
    message = str(refused.value)
    assert "method.lora.modules_to_save" in message and "o_proj" in message and "target_modules" in message
    recipe = Recipe.model_validate(qlora(["o_proj"]))
    with pytest.raises(RuntimeError) as raised:
        trainable_model(load_model(recipe), recipe)
    assert message.split('"')[1] in str(raised.value), "the reason quoted is the one the wrap raises"
    kept = validate_recipe(qlora(["lm_head", "norm"]))  # unquantised modules: accepted, and they load
    model = trainable_model(load_model(kept), kept)
    assert any(p.requires_grad for name, p in model.named_parameters() if "lm_head" in name)


@pytest.mark.parametrize("config, expected", [
    ({"model_type": "qwen2_5_vl"}, model_classes.IMAGE_TEXT),  # only the image-text mapping holds it
    ({"model_type": "qwen3"}, model_classes.CAUSAL_LM),
    ({"model_type": "llama4", "vision_config": {}}, model_classes.IMAGE_TEXT),  # both map it: the config decides
    ({"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"]}, model_classes.IMAGE_TEXT),
    ({"model_type": "llama4", "architectures": ["Llama4ForCausalLM"]}, model_classes.CAUSAL_LM),
    ({"model_type": "no_such_type"}, model_classes.CAUSAL_LM),
])
def test_a_config_is_built_by_the_auto_class_transformers_maps_it_to(config, expected):
    assert model_classes.auto_class_for(config) == expected
