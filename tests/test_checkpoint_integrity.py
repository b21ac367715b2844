"""A half-written or damaged checkpoint is found from its files and skipped for the newest complete one."""
from __future__ import annotations

import json
import shutil

import pytest

from tuner.launch.checkpoints import checkpoint_states, incomplete_reason, latest_complete_checkpoint
from tuner.launch.integrity import checkpoint_problem
from tuner.recipe.io import load_recipe, recipe_to_yaml
from tuner.recipe.registry import builtin_path
from tuner.rundir.layout import CHECKPOINT_INFO


@pytest.fixture(scope="module")
def real_checkpoints(demo_model_path, tmp_path_factory):
    """Two checkpoints written by a real Trainer with tuner's checkpoint callback (2 steps of the demo model, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from tuner.train.checkpoints import CheckpointInfoCallback

    out = tmp_path_factory.mktemp("trainer") / "checkpoints"
    model = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32)
    samples = [{"input_ids": [1, 5, 6, 7, 2], "labels": [1, 5, 6, 7, 2]}] * 4
    args = TrainingArguments(str(out), max_steps=2, save_steps=1, per_device_train_batch_size=2, report_to=[],
                             use_cpu=True, logging_steps=1, save_total_limit=None, disable_tqdm=True)
    recipe = load_recipe(builtin_path("demo"))
    Trainer(model=model, args=args, train_dataset=samples,
            callbacks=[CheckpointInfoCallback(recipe, recipe_to_yaml(recipe))]).train()
    return out


@pytest.fixture
def checkpoints(real_checkpoints, tmp_path):
    copy = tmp_path / "checkpoints"
    shutil.copytree(real_checkpoints, copy)
    return copy


def truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.slow
def test_complete_checkpoints_pass(checkpoints) -> None:
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-1", "checkpoint-2"]
    assert checkpoint_problem(checkpoints / "checkpoint-2") is None
    assert latest_complete_checkpoint(checkpoints) == checkpoints / "checkpoint-2"


@pytest.mark.slow
@pytest.mark.parametrize("damage, expected", [
    pytest.param(lambda c: truncate(c / "model.safetensors"), "model.safetensors: truncated", id="weights half"),
    pytest.param(lambda c: truncate(c / "model.safetensors", keep=0.00001), "model.safetensors: truncated", id="weights header"),
    pytest.param(lambda c: truncate(c / "optimizer.pt"), "optimizer.pt: truncated (its zip directory is missing)", id="optimizer"),
    pytest.param(lambda c: truncate(c / "rng_state.pth", keep=0.9), "rng_state.pth: truncated", id="rng state"),
    pytest.param(lambda c: (c / "trainer_state.json").unlink(), "trainer_state.json missing", id="no trainer state"),
    pytest.param(lambda c: truncate(c / "trainer_state.json"), "trainer_state.json: truncated or damaged JSON", id="trainer state half"),
    pytest.param(lambda c: (c / "model.safetensors").unlink(), "no model weights", id="no weights"),
    pytest.param(lambda c: (c / CHECKPOINT_INFO).unlink(), "the run stopped while saving it", id="no tuner marker"),
])
def test_a_damaged_newest_checkpoint_is_skipped_with_the_reason(checkpoints, damage, expected) -> None:
    newest = checkpoints / "checkpoint-2"
    damage(newest)
    assert expected in incomplete_reason(newest)
    assert latest_complete_checkpoint(checkpoints) == checkpoints / "checkpoint-1"
    states = [(path.name, why) for path, why in checkpoint_states(checkpoints)]
    assert states[1] == ("checkpoint-1", None) and states[0][0] == "checkpoint-2" and expected in states[0][1]


def flip_bytes(path, where: float) -> None:
    """Damage the file in place without changing its size (a bad disk block, a bit flip in transfer)."""
    data = bytearray(path.read_bytes())
    at = int(len(data) * where)
    data[at:at + 4] = bytes(255 - byte for byte in data[at:at + 4])
    path.write_bytes(bytes(data))


def rewrite_header(path, old: bytes, new: bytes) -> None:
    """Change the safetensors header keeping every byte count: offsets that no longer add up."""
    data = path.read_bytes()
    assert len(old) == len(new) and data.count(old) >= 1
    path.write_bytes(data.replace(old, new, 1))


@pytest.mark.slow
@pytest.mark.parametrize("damage, expected", [
    pytest.param(lambda c: flip_bytes(c / "model.safetensors", 0.6), "model.safetensors: changed since it was saved",
                 id="weights data"),
    pytest.param(lambda c: flip_bytes(c / "optimizer.pt", 0.3), "optimizer.pt: changed since it was saved", id="optimizer"),
    pytest.param(lambda c: rewrite_header(c / "model.safetensors", b'"data_offsets":[0,', b'"data_offsets":[8,'),
                 "model.safetensors: damaged header (", id="header offsets"),
    pytest.param(lambda c: rewrite_header(c / "model.safetensors", b'"dtype":"F32"', b'"dtype":"F16"'),
                 "model.safetensors: damaged header (", id="header dtype"),
])
def test_a_checkpoint_damaged_without_changing_size_is_skipped(checkpoints, damage, expected) -> None:
    newest = checkpoints / "checkpoint-2"
    sizes = {p.name: p.stat().st_size for p in newest.iterdir()}
    damage(newest)
    assert {p.name: p.stat().st_size for p in newest.iterdir()} == sizes
    assert expected in incomplete_reason(newest)
    assert latest_complete_checkpoint(checkpoints) == checkpoints / "checkpoint-1"


def test_sharded_weights_with_a_missing_shard(tmp_path) -> None:
    checkpoint = tmp_path / "checkpoint-10"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    assert checkpoint_problem(checkpoint) == "shards missing: model-00001-of-00002.safetensors, model-00002-of-00002.safetensors"


def test_no_checkpoint_at_all(tmp_path) -> None:
    assert latest_complete_checkpoint(tmp_path / "none") is None
    (tmp_path / "checkpoint-3").mkdir()
    assert latest_complete_checkpoint(tmp_path) is None
