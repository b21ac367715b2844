"""Out of GPU memory is answered with the advisor's next rung, as --set lines that validate."""
from __future__ import annotations

import pytest

from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.registry import builtin_path

pytest.importorskip("tuner.planner")
from tuner.planner import next_rung  # noqa: E402
from tuner.train.oom import WHY, out_of_memory_advice, rung_overrides  # noqa: E402

GPU = {"hardware": {"gpus_per_machine": 4, "gpu": "A100-80GB"}, "model": {"id": "meta-llama/Llama-3.1-8B"}}


def climbed(recipe, rung):
    """The recipe after following the advice, as a user would with --set."""
    from tuner.recipe.io import RecipeSource, apply_overrides

    data = recipe.model_dump(mode="json")
    return validate_recipe(apply_overrides(data, rung_overrides(recipe, rung), RecipeSource()))


@pytest.mark.parametrize("memory", [
    {"distributed": "ddp", "micro_batch_size": 8},
    {"distributed": "deepspeed", "zero_stage": 2, "micro_batch_size": 1},
    {"distributed": "deepspeed", "zero_stage": 3, "gradient_checkpointing": True, "micro_batch_size": 1},
])
def test_every_advised_rung_is_a_valid_next_recipe(memory) -> None:
    recipe = validate_recipe({**GPU, "memory": memory})
    rung = next_rung(recipe)
    after = climbed(recipe, rung)
    assert next_rung(after) != rung or rung == "micro_batch"
    assert after.effective_batch_size == recipe.effective_batch_size
    advised, message = out_of_memory_advice(recipe, "my.yaml")
    assert advised == rung and WHY[rung] in message
    assert "tuner run my.yaml --set " in message and "\n" not in message
    assert ("--resume" in message) == (rung in ("micro_batch", "gradient_checkpointing"))  # same checkpoint layout


def test_top_of_the_ladder_says_what_is_left() -> None:
    recipe = validate_recipe({**GPU, "memory": {"distributed": "deepspeed", "zero_stage": 3, "gradient_checkpointing": True,
                                                 "offload_optimizer": "cpu", "offload_params": "cpu"}})
    assert out_of_memory_advice(recipe)[0] is None
    assert "max_seq_length" in out_of_memory_advice(recipe)[1]


def test_cpu_demo_gets_advice_too() -> None:
    rung, message = out_of_memory_advice(load_recipe(builtin_path("demo")))
    assert rung == "micro_batch" and "memory.micro_batch_size=16" in message


def test_advice_never_proposes_a_recipe_past_a_field_limit(capsys) -> None:
    """Halving a micro-batch of 2 with accumulation 65536 would need 131072 steps (found by fuzzing)."""
    from tuner.cli import main

    settings = ["model.id=meta-llama/Llama-3.2-1B", "hardware.gpus_per_machine=1", "hardware.gpu=24GB",
                "memory.mixed_precision=bf16", "model.dtype=bfloat16", "memory.micro_batch_size=2",
                "memory.gradient_accumulation_steps=65536", "memory.max_seq_length=8192"]
    code = main(["plan", "demo", "--advise", "--json", *[arg for s in settings for arg in ("--set", s)]])
    assert code in (0, 1), capsys.readouterr().err
