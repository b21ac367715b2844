"""Which linears LoRA may wrap: any ``nn.Linear`` whose forward PEFT's wrapper can run, and no other.  PEFT adds its
update to what the base layer returns, so a subclass whose own forward returns something else than the map of its
input (Llama 4's router: a tuple; DeepSeek-V4's grouped projection: a reshaped map) fails, or silently changes
shape, at the first step.  The class is every forward a model's code can give an nn.Linear; these tests generate
them."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.catalog.meta_inventory import unadaptable_linears


def _forwards():
    import torch
    import torch.nn.functional as F

    return {  # name -> (forward, whether it returns the map of its input, whole)
        "plain": None,
        "recomputed (Falcon)": lambda self, x: x @ self.weight.T,
        "scaled map": lambda self, x: F.linear(x, self.weight) * 2.0,
        "scores and logits (Llama 4's router)": lambda self, x: (torch.sigmoid(F.linear(x, self.weight)),
                                                                 F.linear(x, self.weight)),
        "grouped (DeepSeek-V4)": lambda self, x: F.linear(x, self.weight).reshape(*x.shape[:-1], 2, -1),
        "top-1 score": lambda self, x: F.linear(x, self.weight).max(dim=-1, keepdim=True).values,
        "a dict": lambda self, x: {"logits": F.linear(x, self.weight)},
        "input shape checked": lambda self, x: F.linear(x.view(-1, 3, self.in_features // 3).flatten(1), self.weight),
    }


FORWARD_NAMES = list(_forwards())
RETURNS_ITS_MAP = {"plain", "recomputed (Falcon)", "scaled map", "input shape checked"}


def _model(kinds: list[str]):
    import torch

    forwards = _forwards()

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layers = []
            for index, kind in enumerate(kinds):
                cls = torch.nn.Linear if forwards[kind] is None else \
                    type(f"Linear{index}", (torch.nn.Linear,), {"forward": forwards[kind]})
                layers.append(cls(6, 8, bias=False))
            self.layers = torch.nn.ModuleList(layers)

        def forward(self, x):
            return [layer(x) for layer in self.layers]

    return Toy()


def _shape(out):
    import torch

    return tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__


@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(st.sampled_from(FORWARD_NAMES), min_size=1, max_size=5))
def test_a_linear_is_left_out_exactly_when_peft_cannot_run_its_forward(kinds):
    """For any mix of forwards: unadaptable_linears (run on the meta device, as the inventory runs it) names
    exactly the layers whose LoRA-wrapped forward raises or returns another shape than the layer did; with them
    excluded, the wrapped model runs and its adapters get gradients."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    with torch.device("meta"):
        excluded = unadaptable_linears(_model(kinds))
    assert excluded == {f"layers.{i}" for i, kind in enumerate(kinds) if kind not in RETURNS_ITS_MAP}, kinds
    x = torch.randn(2, 6)
    for index in range(len(kinds)):
        base = _model(kinds)
        expected = _shape(base.layers[index](x))
        wrapped = get_peft_model(base, LoraConfig(r=2, target_modules=[f"layers.{index}"], init_lora_weights=False))
        try:
            runs = _shape(wrapped.base_model.model.layers[index](x)) == expected
        except (RuntimeError, TypeError, AttributeError):
            runs = False
        assert runs == (f"layers.{index}" not in excluded), (kinds[index], expected)
    kept = [f"layers.{i}" for i in range(len(kinds)) if f"layers.{i}" not in excluded]
    if kept:
        wrapped = get_peft_model(_model(kinds), LoraConfig(r=2, target_modules=kept, init_lora_weights=False))
        outputs = wrapped(x)
        sum(outputs[int(name.split(".")[1])].sum() for name in kept).backward()
        assert all(p.grad is not None for name, p in wrapped.named_parameters() if "lora_" in name)


@pytest.mark.parametrize("model_type, expected", [
    ("llama4_text", {"Llama4Router"}), ("phimoe", {"PhimoeTopKRouter"}), ("deepseek_v4", {"DeepseekV4GroupedLinear"}),
    ("falcon", set()), ("llama", set())])
def test_transformers_own_overridden_linears_are_judged_by_what_they_return(model_type, expected):
    """The members transformers 5.24 ships (every nn.Linear subclass of its model code): the two routers and the
    grouped projection are left out; Falcon's linear, which recomputes the map, keeps its adapters."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, num_hidden_layers=2)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    found = {type(model.get_submodule(path)).__name__ for path in unadaptable_linears(model)}
    assert found == expected
    if model_type == "falcon":
        assert any(type(module).__name__ == "FalconLinear" for module in model.modules())


def test_the_plan_names_what_lora_leaves_out_and_training_builds_the_same_adapters(tmp_path):
    """A Llama 4 text model under all-linear LoRA: the plan's note names the router, and the model training builds
    (build_on_meta: the class, then tuner's LoRA config) holds the plan's trainable parameters, none on a router."""
    import json

    from tuner.loading.model import build_on_meta
    from tuner.planner import plan
    from tuner.recipe.io import validate_recipe

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama4_text", "architectures": ["Llama4ForCausalLM"], "hidden_size": 64,
        "intermediate_size": 64, "intermediate_size_mlp": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 2, "vocab_size": 256,
        "interleave_moe_layer_step": 1}))
    recipe = validate_recipe({"model": {"id": str(tmp_path)}, "method": {"kind": "lora", "lora": {"dropout": 0}},
                              "hardware": {"gpus_per_machine": 1, "gpu": "H100-80GB"}})
    memory_plan = plan(recipe)
    assert any("no adapter on model.layers.*.feed_forward.router (Llama4Router)" in note for note in memory_plan.notes)
    model = build_on_meta(recipe, layers=None)
    adapted = [name for name, p in model.named_parameters() if p.requires_grad]
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == memory_plan.trainable_params
    assert adapted and not any(".router." in name for name in adapted)
