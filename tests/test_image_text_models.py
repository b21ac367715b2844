"""Image-text models are planned from their real module tree (issue 50): the model transformers' image-text auto
class builds, its vision tower, projector and language model each a part with its parameters, and ``method.train``
choosing what trains -- the rest loaded and frozen."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from image_text_configs import CLASSES, TEXT, VISION, tiny_config
from tuner.planner import plan
from tuner.recipe.io import validate_recipe
from tuner.recipe.source import RecipeError


def _meta(config: dict):
    from tuner.catalog.meta_inventory import config_object, meta_model

    return meta_model(config_object(config, "test"))


def _model_dir(tmp_path, model_type: str) -> tuple[str, dict]:
    config = tiny_config(model_type)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path), config


def _recipe(model: str, data: dict | None = None, **method):
    return validate_recipe({"model": {"id": model}, "method": {"kind": "full", **method},
                            "hardware": {"gpus_per_machine": 1, "gpu": "H100-80GB"},
                            **({"data": data} if data else {})})


@pytest.mark.parametrize("model_type", sorted(CLASSES))
def test_every_image_text_class_plans_its_meta_built_total_with_the_tower_frozen(model_type, tmp_path):
    from transformers import AutoModelForImageTextToText

    model, config = _model_dir(tmp_path, model_type)
    built = _meta(config)
    assert isinstance(built, tuple(AutoModelForImageTextToText._model_mapping.values()))
    count = sum(p.numel() for p in built.parameters())  # tied weights once
    tower = built.get_encoder(modality="image")
    tower_count = sum(p.numel() for p in tower.parameters())
    memory_plan = plan(_recipe(model))
    parts = memory_plan_parts(model)
    assert memory_plan.params["total"] == count == sum(info["params"] for info in parts.values())
    merger = sum(p.numel() for path in parts["projector"]["paths"] if path.startswith(parts["vision_tower"]["paths"][0])
                 for p in built.get_submodule(path).parameters())  # Qwen-VL's merger runs last in the tower
    assert parts["vision_tower"]["params"] == tower_count - merger
    assert parts["projector"]["params"] > 0 and parts["language_model"]["params"] > parts["projector"]["params"]
    # full fine-tuning of the language model only: the tower and the projector are frozen
    assert memory_plan.trainable_params == parts["language_model"]["params"]
    assert memory_plan.verdict in ("fits", "tight", "does not fit")
    note = next(n for n in memory_plan.notes if n.startswith("image-text model"))
    assert "vision tower and the projector are loaded with the model and frozen" in note
    assert type(tower).__name__ in note



@settings(max_examples=12, deadline=None)
@given(model_type=st.sampled_from(sorted(CLASSES)), vocab=st.integers(64, 3000), side=st.integers(2, 40))
@example(model_type="gemma3", vocab=512, side=16)  # the tower's 256 positions came first and were read as 256 tokens
@example(model_type="llava", vocab=100, side=20)  # 401 positions, a vocabulary below them
def test_the_vocabulary_is_the_language_model_s_token_embedding_whatever_the_tower_holds(model_type, vocab, side):
    """The planner's vocabulary (the logits' width, the embedding's rows) is the token embedding transformers builds
    (``get_input_embeddings``), for any image-text class and any tower: a tower's position embedding, first in the
    module tree, is no vocabulary (Gemma 3 27B was planned with 4,096 tokens instead of 262,208)."""
    from tuner.catalog.facts import facts_from_inventory
    from tuner.catalog.meta_inventory import build_inventory

    config = tiny_config(model_type)
    config["text_config"]["vocab_size"] = vocab
    vision = config["vision_config"]
    if "image_size" in vision:  # a tower of side x side patches: its position embedding as large
        vision["image_size"] = side * vision.get("patch_size", 16)
    facts = facts_from_inventory(build_inventory(config, "test"), "test", "test")
    assert facts.vocab_size == _meta(config).get_input_embeddings().num_embeddings

def memory_plan_parts(model: str) -> dict:
    from tuner.catalog.models import model_facts

    return model_facts(model).inventory.parts


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "gemma3", "llama4"])
def test_lora_on_each_part_is_peft_s_own_count_and_a_trained_tower_is_judged_where_modelled(model_type, tmp_path):
    """On text rows a trained tower never runs (its gradients and states counted, nothing saved); on image rows its
    saved activations are planned for the tower kinds tuner.planner.tower_backward holds to traces (Gemma 3's,
    Qwen2.5-VL's), and Llama 4's gets no verdict."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tuner.catalog.meta_inventory import unadaptable_linears

    model, config = _model_dir(tmp_path, model_type)
    built = _meta(config)
    with torch.device("meta"):  # as training wraps it (Llama 4's routers, which return a tuple, left out)
        wrapped = get_peft_model(built, LoraConfig(r=4, target_modules="all-linear",
                                                   exclude_modules=sorted(unadaptable_linears(built)) or None))
    peft_count = sum(p.numel() for name, p in wrapped.named_parameters() if "lora_" in name)
    parts = ["language_model", "projector", "vision_tower"]
    every = plan(_recipe(model, kind="lora", lora={"r": 4}, train=parts))
    text = plan(_recipe(model, kind="lora", lora={"r": 4}))
    assert every.trainable_params == peft_count > text.trainable_params > 0
    assert every.verdict != "cannot judge" and text.verdict != "cannot judge"
    images = plan(_recipe(model, {"source": "rows.jsonl", "format": "image_prompt_answer"}, kind="lora",
                          lora={"r": 4}, train=parts))
    if model_type == "llama4":
        assert images.verdict == "cannot judge" and not images.fits
        assert "vision tower activations" in images.notes[0] and "method.train" in images.notes[0]
    else:
        assert images.verdict != "cannot judge"


def test_a_part_a_causal_lm_lacks_is_refused_naming_method_train(demo_model_path):
    with pytest.raises(RecipeError) as refused:
        validate_recipe({"model": {"id": str(demo_model_path)}, "method": {"train": ["vision_tower"]}})
    message = str(refused.value)
    assert "method.train" in message and "no vision_tower" in message and "causal LM" in message


def test_an_unknown_part_is_one_message_naming_file_line_and_field(tmp_path, tuner_cli):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\n  id: tuner-demo\nmethod:\n  kind: lora\n  train: [language_model, eyes]\n")
    result = tuner_cli("validate", str(recipe))
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr + result.stdout
    assert "recipe.yaml" in err and ":5" in err and "method.train" in err and "Traceback" not in err


def test_building_leaves_the_config_as_it_was_so_its_key_finds_the_inventory():
    """Config classes change nested settings in place (Qwen3-VL's text_config.rope_parameters gains keys): the
    build works on a copy, so the key a plan computes from the file is the key the inventory is stored under."""
    from tuner.catalog.inventory import config_key
    from tuner.catalog.meta_inventory import build_inventory

    from tuner.catalog.models import catalog_config

    config = catalog_config("Qwen/Qwen3-VL-8B-Instruct")  # as published: rope_parameters without its defaults
    before = json.dumps(config, sort_keys=True)
    inventory = build_inventory(config, "Qwen3-VL-8B", lora=False)
    assert json.dumps(config, sort_keys=True) == before
    assert inventory.config_sha256 == config_key(json.loads(before))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model_type=st.sampled_from(sorted(CLASSES)), data=st.data())
def test_any_nested_config_with_settings_left_to_the_defaults_builds_under_its_own_key(model_type, data):
    """The class: a config whose nested settings transformers' config classes fill in (text_config, vision_config,
    rope_parameters with keys left out): building never changes the mapping it was given."""
    from tuner.catalog.inventory import config_key
    from tuner.catalog.meta_inventory import build_inventory

    config = tiny_config(model_type)
    for sub in ("text_config", "vision_config"):
        optional = sorted(key for key, value in config[sub].items() if key not in TEXT and key not in VISION
                          and key != "model_type")
        for key in data.draw(st.lists(st.sampled_from(optional), unique=True, max_size=6), label=sub):
            del config[sub][key]
    rope = config["text_config"].get("rope_parameters")
    if isinstance(rope, dict):
        keep = data.draw(st.lists(st.sampled_from(sorted(rope)), unique=True), label="rope_parameters")
        config["text_config"]["rope_parameters"] = {key: rope[key] for key in keep}
    before = json.dumps(config, sort_keys=True)
    try:
        inventory = build_inventory(config, model_type, lora=False)
    except Exception as exc:  # a setting the class cannot do without: refused in transformers' words, unchanged
        assert "transformers" in str(exc)
    else:
        assert inventory.config_sha256 == config_key(json.loads(before))
    assert json.dumps(config, sort_keys=True) == before


SUBSETS = [list(subset) for size in (1, 2, 3) for subset in
           __import__("itertools").combinations(("language_model", "projector", "vision_tower"), size)]


@settings(max_examples=16, deadline=None)
@given(model_type=st.sampled_from(sorted(CLASSES)), train=st.sampled_from(SUBSETS),
       kind=st.sampled_from(["full", "lora"]))
@example(model_type="llava", train=["language_model"], kind="full")  # demo-vlm's recipe: the tower trained
@example(model_type="qwen2_5_vl", train=["projector"], kind="full")  # the merger, inside the tower, trains alone
@example(model_type="gemma3", train=["vision_tower", "language_model"], kind="lora")
@example(model_type="gemma3", train=["projector"], kind="lora")  # its projector is a parameter: refused at validate
def test_what_trains_is_what_the_plan_counts_for_any_class_parts_and_method(tmp_path_factory, model_type, train,
                                                                           kind):
    """The model as training builds it (its class, then frozen parts or adapters: build_on_meta, every layer) holds
    exactly the trainable parameters the plan counts, for any image-text class, any choice of parts to train and
    full or LoRA. Full fine-tuning used to train the whole model (tower and projector too) while the plan counted
    the language model only; LoRA ignored method.train."""
    from tuner.loading.model import build_on_meta, count_parameters

    model, config = _model_dir(tmp_path_factory.mktemp(model_type), model_type)
    try:
        recipe = _recipe(model, kind=kind, train=train, **({"lora": {"r": 4}} if kind == "lora" else {}))
    except RecipeError as refused:  # LoRA with nothing to adapt in the parts named (Gemma 3's projector alone)
        assert kind == "lora" and "method.train" in str(refused) and "no layer PEFT can adapt" in str(refused)
        _assert_peft_adapts_nothing(config, train)
        return
    trainable, _ = count_parameters(build_on_meta(recipe, layers=None))
    assert trainable == plan(recipe).trainable_params, (model_type, train, kind)


def _assert_peft_adapts_nothing(config: dict, train: list[str]) -> None:
    """PEFT's own word on a refused LoRA: all-linear inside the named parts only targets no module."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.utils.error import NoMatchingPeftModuleError

    from tuner.catalog.meta_inventory import part_of, part_paths

    built = _meta(config)
    found = part_paths(built)
    outside = [name for name, _ in built.named_modules() if name and part_of(name, found) not in train]
    with torch.device("meta"), pytest.raises(NoMatchingPeftModuleError):
        get_peft_model(built, LoraConfig(r=4, target_modules="all-linear", exclude_modules=outside))


def test_full_fine_tuning_of_the_demo_vlm_freezes_its_tower_and_projector():
    """The demo-vlm recipe (full, method.train's default: the language model): the case the plan got wrong."""
    from tuner.loading.model import build_on_meta
    from tuner.recipe import load_recipe
    from tuner.recipe.registry import builtin_path

    model = build_on_meta(load_recipe(builtin_path("demo-vlm")), layers=None)
    trains = {name.split(".")[1] for name, p in model.named_parameters() if p.requires_grad}
    frozen = {name.split(".")[1] for name, p in model.named_parameters() if not p.requires_grad}
    assert trains == {"language_model"} and frozen == {"vision_tower", "multi_modal_projector"}, (trains, frozen)


@pytest.mark.parametrize("model_type", sorted(CLASSES))
def test_qlora_of_any_image_text_class_quantises_what_the_plan_counts_and_trains_its_adapters(model_type, tmp_path):
    """Every image-text class loaded for real in 4-bit (bitsandbytes on this CPU, through tuner's own loader): the
    Linear4bit weights are the plan's quantised parameters, what stays unquantised is the rest, the adapters are the
    plan's trainable parameters, and one step on a text row moves the adapters only. The plan's count comes from
    transformers' conversion rule applied to the meta-built tree; this is the rule applied by the library itself,
    vision tower and projector included."""
    import bitsandbytes as bnb
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from tuner.catalog.models import model_facts
    from tuner.loading.model import load_model, trainable_model

    torch.manual_seed(0)
    config = tiny_config(model_type)
    AutoModelForImageTextToText.from_config(CONFIG_MAPPING[model_type].from_dict(config)).save_pretrained(tmp_path)
    recipe = validate_recipe({"model": {"id": str(tmp_path), "dtype": "float32"},
                              "method": {"kind": "qlora", "quantization": {"bits": 4}, "lora": {"r": 4, "dropout": 0}},
                              "hardware": {"gpus_per_machine": 1, "gpu": "H100-80GB"}})
    model = load_model(recipe)
    quantised = {name for name, module in model.named_modules() if isinstance(module, bnb.nn.Linear4bit)}
    quantised_params = sum(model.get_submodule(name).weight.quant_state.shape.numel() for name in quantised)
    facts = model_facts(str(tmp_path))
    assert quantised_params == facts.quantizable_params() > 0
    assert any("vision" in name or "visual" in name for name in quantised)  # the tower is quantised too
    rest = sum(p.numel() for name, p in model.named_parameters()
               if name.rsplit(".", 1)[0] not in quantised or not name.endswith(".weight"))
    assert rest == facts.total_params - facts.quantizable_params()
    model = trainable_model(model, recipe)
    memory_plan = plan(recipe)
    adapters = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert sum(p.numel() for p in adapters.values()) == memory_plan.trainable_params, sorted(adapters)
    assert all("lora_" in name for name in adapters)
    before = {name: p.detach().clone() for name, p in adapters.items()}
    ids = torch.randint(0, config["text_config"]["vocab_size"], (2, 12))
    if model_type == "llama4":  # transformers 5.24's Llama4ForConditionalGeneration.forward reads image_outputs from
        # its language model's output, which has none: every forward of the class fails, adapters or not (when
        # this stops raising, the library is fixed and Llama 4's step is tested like the others')
        with pytest.raises(AttributeError, match="image_outputs"):
            model(input_ids=ids, labels=ids, use_cache=False)
        return
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    torch.optim.SGD(adapters.values(), lr=1.0).step()
    assert any(not torch.equal(before[name], p) for name, p in adapters.items())
