"""--set overrides, YAML quirks, and the resolved-recipe round trip."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.recipe import RecipeError, load_recipe, recipe_from_yaml, recipe_to_yaml
from tuner.recipe.overrides import NotASection, set_dotted
from tuner.recipe.registry import builtin_names, builtin_path, recipes_dir


def test_set_overrides_keep_types(tmp_path):
    recipe = load_recipe(builtin_path("demo"), [
        "training.micro_batch_size=4", "training.learning_rate=1e-4", "memory.gradient_checkpointing=true",
        "method.lora.target_modules=[q_proj, v_proj]", "name=other",
    ])
    assert recipe.training.micro_batch_size == 4
    assert recipe.training.learning_rate == pytest.approx(1e-4)
    assert recipe.memory.gradient_checkpointing is True
    assert recipe.method.lora.target_modules == ["q_proj", "v_proj"]
    assert recipe.output.dir == "runs/other", "derived defaults follow the override"


def test_unbracketed_lora_targets_are_a_list_and_unknown_ones_are_named():
    lora = ["method.kind=lora"]
    assert load_recipe(builtin_path("demo"), [*lora, "method.lora.target_modules=q_proj,v_proj"]).method.lora \
        .target_modules == ["q_proj", "v_proj"]
    assert load_recipe(builtin_path("demo"), [*lora, "method.lora.target_modules=q_proj"]).method.lora \
        .target_modules == ["q_proj"]
    with pytest.raises(RecipeError) as caught:  # Phi-3 style fused names on a Llama: 0 trainable parameters
        load_recipe(builtin_path("demo"), [*lora, "method.lora.target_modules=qkv_proj,o_proj"])
    assert str(caught.value) == (
        "--set method.lora.target_modules: method.lora.target_modules: 'qkv_proj' matches no module of builtin:demo; "
        "its linear layers are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (and lm_head): pick "
        "from them, or use all-linear.")


def test_set_unknown_key_points_at_the_override():
    with pytest.raises(RecipeError) as caught:
        load_recipe(builtin_path("demo"), ["training.micro_bach_size=4"])
    assert "--set training.micro_bach_size: training.micro_bach_size: unknown key. Did you mean 'micro_batch_size'?" in str(caught.value)


def test_set_wrong_type_points_at_the_override():
    with pytest.raises(RecipeError, match=r"--set training.max_seq_length: training.max_seq_length: .*integer"):
        load_recipe(builtin_path("demo"), ["training.max_seq_length=long"])


def test_set_without_equals_explains_the_syntax():
    with pytest.raises(RecipeError, match="expected dotted.key=value"):
        load_recipe(builtin_path("demo"), ["training.micro_batch_size"])


def test_set_into_a_value_is_refused():
    with pytest.raises(RecipeError, match="is a value, not a section"):
        load_recipe(builtin_path("demo"), ["name.first=x"])


def test_the_one_dotted_setter_keeps_each_callers_rules_for_none_and_a_value_in_the_way():
    """--set writes YAML's null and refuses to go through a value; the wizard removes the key and replaces it."""
    for_set = {"name": "x", "training": {"eval_steps": 10}}
    set_dotted(for_set, ("training", "eval_steps"), None, none_removes=False, replace_values=False)
    set_dotted(for_set, ("memory", "fsdp", "sharding_strategy"), "full_shard", none_removes=False, replace_values=False)
    assert for_set == {"name": "x", "training": {"eval_steps": None}, "memory": {"fsdp": {"sharding_strategy": "full_shard"}}}
    with pytest.raises(NotASection, match="^name$"):
        set_dotted(for_set, ("name", "first"), "y", none_removes=False, replace_values=False)
    for_wizard = {"name": "x", "training": {"eval_steps": 10}}
    set_dotted(for_wizard, ("training", "eval_steps"), None, none_removes=True, replace_values=True)
    set_dotted(for_wizard, ("name", "first"), "y", none_removes=True, replace_values=True)
    assert for_wizard == {"name": {"first": "y"}, "training": {}}


def test_cross_field_conflict_from_override_names_the_flag():
    with pytest.raises(RecipeError, match=r"--set memory.offload_optimizer: memory.offload_optimizer: offload needs ZeRO"):
        load_recipe(builtin_path("demo"), ["memory.offload_optimizer=cpu"])


def test_bare_no_means_the_precision_named_no(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("memory:\n  mixed_precision: no\n")
    assert load_recipe(path).memory.mixed_precision == "no"


@pytest.mark.parametrize("name", builtin_names())
def test_every_builtin_recipe_is_valid_and_round_trips(name):
    recipe = load_recipe(builtin_path(name))
    text = recipe_to_yaml(recipe)
    again = recipe_from_yaml(text)
    assert again == recipe
    assert recipe_to_yaml(again) == text, "a resolved recipe dumps byte for byte the same"
    resolved = yaml.safe_load(text)
    assert resolved["model"]["dtype"] != "auto" and resolved["output"]["dir"], "every default is explicit"


def test_recipes_folder_has_the_demo():
    assert (recipes_dir() / "demo.yaml").is_file()
    assert "demo" in builtin_names()


@pytest.mark.parametrize("assignment", ["training.micro_batch_size=true", "training.epochs=true", "memory.zero_stage=false",
                                        "hardware.main_process_port=yes", "training.max_steps=on"])
def test_true_and_false_are_not_numbers(assignment):
    field = assignment.partition("=")[0]
    with pytest.raises(RecipeError, match=rf"--set {field}: {field}: must be a number, not (true|false)"):
        load_recipe(builtin_path("demo"), [assignment, "memory.distributed=deepspeed"])


@pytest.mark.parametrize("text, name", [("123", "123"), ("2018-01-01", "2018-01-01"), ("1e3", "1e3"), ("0x1F", "0x1F"),
                                        ("1_000", "1_000"), ("007", "007"), ("1.50", "1.50")])
def test_names_typed_as_numbers_or_dates_by_yaml_keep_their_text(tmp_path, text, name):
    path = tmp_path / "r.yaml"
    path.write_text(f"name: {text}\nmodel:\n  revision: {text}\n")
    recipe = load_recipe(path)
    assert recipe.name == name and recipe.output.dir == f"runs/{name}"
    assert recipe.model.revision == text  # a tag or an all-digit commit prefix, as written
    assert load_recipe(builtin_path("demo"), [f"name={text}"]).name == name
    assert recipe_from_yaml(recipe_to_yaml(recipe)).name == name  # the lock file reads back the same


def test_a_name_no_file_system_allows_is_refused_naming_the_field():
    with pytest.raises(RecipeError, match=r"--set output.dir: output.dir: has a part longer than 255 bytes"):
        load_recipe(builtin_path("demo"), ["output.dir=runs/" + "9" * 300])
    assert load_recipe(builtin_path("demo"), ["output.dir=runs/" + "9" * 255]).output.dir.endswith("9" * 255)
