"""Expert parallelism (issue 51): ``parallelism.ep`` checked at validate as transformers' DistributedConfig checks it,
in the library's words; what only infers (pipeline stages) refused for training."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tuner.recipe import RecipeError
from tuner.recipe.io import validate_recipe

GPUS = 8
QWEN3_MOE = "Qwen/Qwen3-30B-A3B"  # the catalog's: 128 experts, base_model_ep_plan with token dispatch
QWEN3_MOE_EXPERTS = 128


def moe_recipe(ep: int, tp: int = 1, dp_replicate: int = 1, **memory) -> dict:
    return {
        "model": {"id": QWEN3_MOE},
        "hardware": {"gpus_per_machine": GPUS, "gpu": "H100-80GB"},
        "memory": {"distributed": "fsdp", "attention": "sdpa", **memory},
        "parallelism": {"ep": ep, "tp": tp, **({"dp_replicate": dp_replicate} if dp_replicate > 1 else {})},
    }


def accepted(data: dict) -> tuple[bool, str]:
    try:
        validate_recipe(data)
    except RecipeError as exc:
        return False, str(exc)
    return True, ""


def transformers_accepts(ep: int, tp: int, dp_replicate: int) -> bool:
    """DistributedConfig's own checks, and MoEParamShard's: the experts split evenly over the ep ranks."""
    from transformers.distributed import DistributedConfig

    try:
        DistributedConfig(tp_size=tp, fsdp_size=GPUS // (tp * dp_replicate), dp_replicate_size=dp_replicate,
                          ep_size=ep)
    except ValueError:
        return False
    return QWEN3_MOE_EXPERTS % ep == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ep=st.integers(2, 24), tp=st.sampled_from([1, 2, 4]), dp_replicate=st.sampled_from([1, 2]))
def test_ep_on_a_valid_layout_is_accepted_exactly_when_transformers_accepts_it(ep, tp, dp_replicate):
    """The class: any ep over any fsdp layout (one tuner accepts for tp without ep; with tp 1 only ep lays it out).
    tuner refuses what DistributedConfig or the expert shard refuses, naming parallelism.ep, and nothing else."""
    base_ok = tp == 1 or accepted(moe_recipe(1, tp, dp_replicate))[0]
    ok, message = accepted(moe_recipe(ep, tp, dp_replicate))
    assert ok == (base_ok and transformers_accepts(ep, tp, dp_replicate)), message
    if base_ok and not ok:
        assert "parallelism.ep" in message
        assert ("must divide `fsdp_size * tp_size`" in message or "must be a multiple of `tp_size`" in message
                or "Cannot evenly shard 128 experts across" in message), message


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"model": {"id": "meta-llama/Llama-3.1-8B"}}, "parallelism.ep", "has no `ep_plan`"),
    ({"memory": {"distributed": "ddp"}}, "parallelism.ep", "ddp has no expert sharding"),
    ({"memory": {"distributed": "deepspeed", "zero_stage": 3}}, "parallelism.ep", "deepspeed has no expert sharding"),
    ({"method": {"kind": "lora"}}, "method.kind", "got mixed torch.Tensor and DTensor"),
    ({"objective": {"kind": "dpo"}}, "parallelism.ep", "sft objective only"),
])
def test_what_ep_cannot_run_is_refused_at_its_field(change, field, words):
    data = moe_recipe(8)
    for section, values in change.items():
        data[section] = {**data.get(section, {}), **values}
        if section == "memory" and values.get("distributed") != "fsdp":
            data["parallelism"] = {"ep": 8}
    ok, message = accepted(data)
    assert not ok and f"{field}:" in message and words in message, message


def test_pipeline_stages_only_infer():
    ok, message = accepted({**moe_recipe(1), "parallelism": {"pp": 2}})
    assert not ok and "parallelism.pp:" in message and "forward only" in message


def test_the_cli_names_file_line_and_field_and_exits_2(tuner_cli, tmp_path):
    recipe = tmp_path / "dense-ep.yaml"
    recipe.write_text("model:\n  id: builtin:demo\nhardware:\n  num_processes: 2\nmemory:\n  distributed: fsdp\n"
                      "parallelism:\n  ep: 2\n", encoding="utf-8")
    result = tuner_cli("validate", str(recipe))
    assert result.returncode == 2
    assert f"{recipe}:8: parallelism.ep: `ep_size=2` was requested, but builtin:demo (llama) has no `ep_plan`" in \
        result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_demo_moe_ep_validates_as_two_expert_ranks():
    from tuner.recipe import load_recipe
    from tuner.recipe.registry import resolve_recipe_argument

    recipe = load_recipe(resolve_recipe_argument("demo-moe-ep"))
    assert (recipe.parallelism.ep, recipe.parallelism.dp_shard, recipe.world_size) == (2, 2, 2)
