"""The Trainer options tuner sets exist in the installed transformers, under whichever name it uses."""
from __future__ import annotations

import dataclasses

from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_path
from tuner.train.__main__ import checkpointing_arguments, training_arguments


@dataclasses.dataclass
class Before524:
    gradient_checkpointing: bool = False
    gradient_checkpointing_kwargs: dict | None = None


@dataclasses.dataclass
class From524(Before524):
    activation_checkpointing: bool = False
    activation_checkpointing_kwargs: dict | None = None


def test_checkpointing_option_name_follows_the_release():
    assert checkpointing_arguments(Before524, True) == {
        "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}
    assert checkpointing_arguments(From524, True) == {
        "activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": False}}
    assert checkpointing_arguments(From524, False)["activation_checkpointing_kwargs"] is None


def test_installed_trainer_accepts_the_arguments(tmp_path):
    recipe = load_recipe(builtin_path("demo"), ["memory.gradient_checkpointing=true"])
    args = training_arguments(recipe, tmp_path)
    enabled = getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing
    assert enabled and args.use_cpu and args.per_device_train_batch_size == 32
