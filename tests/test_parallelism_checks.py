"""tuner's parallelism rules agree with Accelerate's and transformers' own: every fsdp layout tuner accepts,
ParallelismConfig accepts (construction and its check against a launched FSDP2 accelerator) and, with tp, so does
transformers' DistributedConfig, which shards the model while loading it; every one they refuse, tuner refuses first,
naming a field."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from tuner.recipe import RecipeError
from tuner.recipe.io import validate_recipe

GPUS = 8


def recipe_data(dp_replicate: int, dp_shard: int, tp: int, cp: int) -> dict:
    return {
        "model": {"id": "meta-llama/Llama-3.1-8B"},
        "hardware": {"gpus_per_machine": GPUS, "gpu": "H100-80GB"},
        "memory": {"distributed": "fsdp", "attention": "sdpa"}, "training": {"max_seq_length": 4096},
        "parallelism": {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "tp": tp, "cp": cp},
    }


def accelerate_accepts(dp_replicate: int, dp_shard: int, tp: int, cp: int) -> bool:
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DistributedType

    try:
        config = ParallelismConfig(dp_replicate_size=dp_replicate, dp_shard_size=dp_shard, tp_size=tp, cp_size=cp)
        # the attributes _validate_accelerator reads from an Accelerator launched with FSDP2 on 8 GPUs
        launched = SimpleNamespace(multi_device=False, is_fsdp2=True, num_processes=GPUS, is_main_process=True,
                                   distributed_type=DistributedType.FSDP)
        config._validate_accelerator(launched)
    except ValueError:
        return False
    return True


def transformers_loads(dp_replicate: int, dp_shard: int, tp: int, cp: int) -> bool:
    """With tp, transformers shards the model at load over a (pp, dp_replicate, fsdp, tp) mesh, which must hold every
    rank (transformers.distributed.utils.initialize_distributed_mesh); without tp it leaves the model to Accelerate."""
    import math

    from tuner.recipe.schema import Recipe
    from tuner.train.parallelism import distributed_config, loads_sharded

    recipe = Recipe.model_validate(recipe_data(dp_replicate, dp_shard, tp, cp))  # the schema only, not the checks
    if not loads_sharded(recipe):
        return True
    config = distributed_config(recipe)
    return math.prod((config.pp_size, config.dp_replicate_size, config.fsdp_size, config.tp_size)) == GPUS


LAYOUTS = [layout for layout in itertools.product((1, 2, 4, 8), repeat=4)
           if layout[0] * layout[1] * layout[2] * layout[3] == GPUS and (layout[2] > 1 or layout[3] > 1)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["r{}-s{}-tp{}-cp{}".format(*layout) for layout in LAYOUTS])
def test_tuner_accepts_exactly_the_fsdp_layouts_accelerate_and_transformers_accept(layout):
    try:
        validate_recipe(recipe_data(*layout))
        tuner_accepts, message = True, ""
    except RecipeError as exc:
        tuner_accepts, message = False, str(exc)
    assert tuner_accepts == (accelerate_accepts(*layout) and transformers_loads(*layout)), message
    if not tuner_accepts:
        assert "parallelism." in message


def test_a_mismatched_product_is_refused_before_accelerate_sees_it():
    with pytest.raises(RecipeError, match=r"dp_replicate x dp_shard x tp x cp = 1 x 2 x 2 x 1 = 4, but the run has 8"):
        validate_recipe(recipe_data(1, 2, 2, 1))


def test_derived_degrees_fill_the_world():
    recipe = validate_recipe({**recipe_data(1, 1, 2, 1), "parallelism": {"tp": 2}})
    assert (recipe.parallelism.dp_replicate, recipe.parallelism.dp_shard, recipe.data_parallel) == (1, 4, 4)
