"""Out of GPU memory is answered with the advisor's next rung, as --set lines that make the advisor's own recipe."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.planner import next_step
from tuner.planner.advisor import REASONS
from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.overrides import apply_overrides
from tuner.recipe.registry import builtin_path
from tuner.recipe.schema import Recipe
from tuner.recipe.source import RecipeSource
from tuner.recipe.tactics import KEEPS_CHECKPOINTS, LADDER, Rung
from tuner.train.oom import out_of_memory_advice

GPU = {"hardware": {"gpus_per_machine": 4, "gpu": "A100-80GB"}, "model": {"id": "meta-llama/Llama-3.1-8B"}}


def followed(recipe: Recipe, message: str) -> Recipe:
    """The recipe after following the advice's --set lines, as a user would."""
    sets = re.findall(r"--set (\S+)", message)
    return validate_recipe(apply_overrides(recipe.model_dump(mode="json"), sets, RecipeSource()))


def advice_for(recipe: Recipe) -> tuple[str | None, str, Recipe | None]:
    rung, message = out_of_memory_advice(recipe, "my.yaml")
    return rung, message, followed(recipe, message) if rung else None


@pytest.mark.parametrize("memory", [
    {"distributed": "ddp", "micro_batch_size": 8},
    {"distributed": "deepspeed", "zero_stage": 1, "micro_batch_size": 1},
    {"distributed": "deepspeed", "zero_stage": 2, "micro_batch_size": 1},
    {"distributed": "deepspeed", "zero_stage": 2, "micro_batch_size": 1, "chunked_loss": True},
    {"distributed": "deepspeed", "zero_stage": 3, "gradient_checkpointing": True, "micro_batch_size": 1},
    {"distributed": "deepspeed", "zero_stage": 3, "gradient_checkpointing": True, "activation_offloading": True,
     "micro_batch_size": 1},
])
def test_the_advice_applied_with_set_is_exactly_the_advisors_recipe(memory) -> None:
    recipe = validate_recipe({**GPU, "memory": memory})
    step = next_step(recipe)
    rung, message, after = advice_for(recipe)
    assert rung == step.rung and after == step.recipe  # no second mapping of rung -> fields
    assert REASONS[step.rung].split(" {")[0].split(" over")[0] in message and "\n" not in message
    assert after.effective_batch_size == recipe.effective_batch_size
    assert ("--resume" in message) == (step.rung in KEEPS_CHECKPOINTS)  # same checkpoint layout
    assert next_step(after) is None or next_step(after).rung != rung or rung == Rung.MICRO_BATCH


@pytest.mark.parametrize("strategy, memory, machines, rung, sharding", [
    ("full_shard", {}, 1, Rung.GRADIENT_CHECKPOINTING, "full_shard"),
    ("shard_grad_op", {}, 1, Rung.GRADIENT_CHECKPOINTING, "shard_grad_op"),
    ("shard_grad_op", {"gradient_checkpointing": True, "activation_offloading": True}, 1, Rung.ZERO3, "full_shard"),
    ("hybrid_shard", {"gradient_checkpointing": True, "activation_offloading": True}, 2, Rung.ZERO3, "full_shard"),
    ("hybrid_shard", {"gradient_checkpointing": True, "activation_offloading": True}, 1, Rung.OFFLOAD_OPTIMIZER,
     "hybrid_shard"),
    ("no_shard", {}, 1, Rung.ZERO2, "shard_grad_op"),
])
def test_fsdp_advice_stays_fsdp(strategy, memory, machines, rung, sharding) -> None:
    """FSDP's sharding rungs are FSDP strategies, never DeepSpeed; the chunked loss is skipped (FSDP shards the head)."""
    data = {**GPU, "hardware": {**GPU["hardware"], "machines": machines, "main_process_ip": "10.0.0.1"},
            "memory": {"distributed": "fsdp", "fsdp": {"sharding_strategy": strategy}, **memory}}
    # no_shard is refused by the recipe checks (FSDP2 has no such mode); the advice must still not send it to DeepSpeed
    recipe = Recipe.model_validate(data) if strategy == "no_shard" else validate_recipe(data)
    advised, message, after = advice_for(recipe)
    assert advised == rung, message
    assert "deepspeed" not in message and after.memory.distributed == "fsdp"
    assert after.memory.fsdp.sharding_strategy == sharding
    if rung == Rung.OFFLOAD_OPTIMIZER:  # FSDP offloads parameters, gradients and optimizer states together
        assert after.memory.offload_optimizer == after.memory.offload_params == "cpu"


def test_deepspeed_advice_climbs_in_place_and_skips_what_the_checks_refuse() -> None:
    memory = {"distributed": "deepspeed", "zero_stage": 1, "gradient_checkpointing": True, "activation_offloading": True}
    rung, message, after = advice_for(validate_recipe({**GPU, "memory": memory}))
    assert rung == Rung.CHUNKED_LOSS and "--set memory.chunked_loss=true --resume" in message
    rung, message, after = advice_for(after)
    assert rung == Rung.ZERO2 and "--set memory.zero_stage=2 " in message and "--force" in message
    rung, message, after = advice_for(after)
    # ZeRO-3 shards the output head the chunked loss reads, so the ladder goes on to optimizer offload on ZeRO-2
    assert rung == Rung.OFFLOAD_OPTIMIZER and (after.memory.distributed, after.memory.zero_stage) == ("deepspeed", 2)


def test_top_of_the_ladder_says_what_is_left() -> None:
    recipe = validate_recipe({**GPU, "memory": {"distributed": "deepspeed", "zero_stage": 3, "gradient_checkpointing": True,
                                                 "activation_offloading": True, "offload_optimizer": "cpu",
                                                 "offload_params": "cpu"}})
    assert out_of_memory_advice(recipe)[0] is None
    assert "max_seq_length" in out_of_memory_advice(recipe)[1]


def test_cpu_demo_gets_advice_too() -> None:
    rung, message = out_of_memory_advice(load_recipe(builtin_path("demo")))
    assert rung == "chunked_loss" and "--set memory.chunked_loss=true --resume" in message


def test_rung_names_are_spelled_only_where_the_ladder_is_defined() -> None:
    """The names that are nothing but rungs appear as string literals in tuner/recipe/tactics.py only."""
    root = Path(__file__).resolve().parents[1] / "tuner"
    only_rungs = [rung.value for rung in LADDER if rung.value not in Recipe.model_json_schema()["$defs"]["MemorySection"]
                  ["properties"] and rung.value not in ("lora", "qlora")]
    assert {"zero1", "zero2", "zero3", "micro_batch"} <= set(only_rungs)
    found = [f"{path.relative_to(root)}: {name}" for path in root.rglob("*.py") if path.name != "tactics.py"
             for name in only_rungs if re.search(rf"[\"']{name}[\"']", path.read_text())]
    assert not found


def test_advice_never_proposes_a_recipe_past_a_field_limit(capsys) -> None:
    """Halving a micro-batch of 2 with accumulation 65536 would need 131072 steps (found by fuzzing)."""
    from tuner.cli import main

    settings = ["model.id=meta-llama/Llama-3.2-1B", "hardware.gpus_per_machine=1", "hardware.gpu=24GB",
                "memory.mixed_precision=bf16", "model.dtype=bfloat16", "training.micro_batch_size=2",
                "training.gradient_accumulation_steps=65536", "training.max_seq_length=8192"]
    code = main(["plan", "demo", "--advise", "--json", *[arg for s in settings for arg in ("--set", s)]])
    assert code in (0, 1), capsys.readouterr().err
    recipe = load_recipe(builtin_path("demo"), settings)
    assert next_step(recipe).rung != Rung.MICRO_BATCH
