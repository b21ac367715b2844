"""A half-written or damaged checkpoint is found from its files and skipped for the newest complete one; a byte
damaged in place only with ``--verify`` (recorded SHA-256, zip CRCs)."""
from __future__ import annotations

import hashlib
import json
import shutil
import struct
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.cli import main
from tuner.rundir.checkpoints import (CheckpointRefused, checkpoint_states, incomplete_reason, latest_complete_checkpoint,
                                     resume_checkpoint)
from tuner.launch.run import _resume_notes
from tuner.recipe.io import load_recipe, recipe_to_yaml
from tuner.recipe.registry import builtin_path
from tuner.recipe.source import RecipeError
from tuner.rundir.integrity import checkpoint_problem
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


@pytest.mark.slow
def test_the_save_records_sizes_and_checks_not_hashes(checkpoints) -> None:
    files = json.loads((checkpoints / "checkpoint-2" / CHECKPOINT_INFO).read_text())["files"]
    assert files["model.safetensors"] == {"size": (checkpoints / "checkpoint-2" / "model.safetensors").stat().st_size,
                                          "checked": "safetensors header"}
    assert files["optimizer.pt"]["checked"] == "zip directory" and files["trainer_state.json"]["checked"] == "json"
    assert not any("sha256" in entry for entry in files.values())


def resumed(recipe, resume):
    return recipe.model_copy(update={"training": recipe.training.model_copy(update={"resume": resume})})


@pytest.mark.slow
@pytest.mark.parametrize("damage, expected", [
    pytest.param(lambda c: truncate(c / "model.safetensors"), "model.safetensors: truncated", id="safetensors cut"),
    pytest.param(lambda c: truncate(c / "optimizer.pt", keep=0.99), "optimizer.pt: truncated (its zip directory",
                 id="torn zip"),
    pytest.param(lambda c: (c / "trainer_state.json").write_text('{"global_step": 2,'),
                 "trainer_state.json: truncated or damaged JSON", id="broken json"),
])
def test_a_named_damaged_checkpoint_is_refused_without_verify(checkpoints, damage, expected) -> None:
    newest = checkpoints / "checkpoint-2"
    damage(newest)
    with pytest.raises(CheckpointRefused) as refused:
        resume_checkpoint(resumed(load_recipe(builtin_path("demo")), str(newest)), checkpoints.parent, 1)
    assert str(newest) in str(refused.value) and expected in str(refused.value)
    notes = _resume_notes(resumed(load_recipe(builtin_path("demo")), "auto"), checkpoints.parent)
    assert any(str(newest) in note and expected in note for note in notes), notes


def flip_member_byte(path, member: str) -> None:
    """Flip one byte inside a zip member's stored data (torch.save stores tensors uncompressed)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    at = info.header_offset + 30 + name_length + extra_length + info.file_size // 2
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def largest_member(path) -> str:
    with zipfile.ZipFile(path) as archive:
        return max(archive.infolist(), key=lambda info: info.file_size).filename


@pytest.mark.slow
def test_a_flipped_byte_in_tensor_data_is_caught_only_with_verify(checkpoints) -> None:
    newest, optimizer = checkpoints / "checkpoint-2", checkpoints / "checkpoint-2" / "optimizer.pt"
    member = largest_member(optimizer)
    flip_member_byte(optimizer, member)
    assert incomplete_reason(newest) is None, "sizes, headers and the zip directory are intact"
    assert incomplete_reason(newest, verify=True) == f"optimizer.pt: damaged (zip member {member} fails its CRC-32)"
    recipe = resumed(load_recipe(builtin_path("demo")), "auto")
    assert _resume_notes(recipe, checkpoints.parent) == [f"resuming from {newest}"]
    with pytest.raises(RecipeError, match=r"--verify: .*checkpoint-2: optimizer.pt: damaged"):
        _resume_notes(recipe, checkpoints.parent, verify=True)
    with pytest.raises(CheckpointRefused, match="optimizer.pt: damaged"):
        resume_checkpoint(resumed(recipe, str(newest)), checkpoints.parent, 1, verify=True)
    older = checkpoints / "checkpoint-1"
    assert incomplete_reason(older, verify=True) is None


def with_digests(checkpoint) -> None:
    """Rewrite the info file as tuner wrote it before hashing left the training loop: size and SHA-256 per file."""
    info_path = checkpoint / CHECKPOINT_INFO
    info = json.loads(info_path.read_text())
    info["files"] = {name: {"size": (checkpoint / name).stat().st_size,
                            "sha256": hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()}
                     for name in info["files"]}
    info_path.write_text(json.dumps(info, indent=2) + "\n")


@pytest.mark.slow
def test_an_old_checkpoint_with_digests_resumes_and_verify_checks_them(checkpoints) -> None:
    newest = checkpoints / "checkpoint-2"
    with_digests(newest)
    recipe = resumed(load_recipe(builtin_path("demo")), "auto")
    assert resume_checkpoint(recipe, checkpoints.parent, 1) == newest
    verified = _resume_notes(recipe, checkpoints.parent, verify=True)
    assert verified == [f"resuming from {newest} (verified: every byte read)"]
    flip_bytes(newest / "model.safetensors", 0.6)
    assert incomplete_reason(newest) is None, "without --verify the digests are not read"
    assert incomplete_reason(newest, verify=True) == \
        "model.safetensors: changed since it was saved (its SHA-256 differs)"


def test_verify_without_resume_is_refused(capsys) -> None:
    assert main(["run", "demo", "--verify"]) == 2
    assert "--verify checks the checkpoint a run resumes from: pass it with --resume" in capsys.readouterr().err


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


def test_a_file_damaged_at_save_leaves_the_checkpoint_unmarked(tmp_path) -> None:
    from tuner.rundir.integrity import saved_files

    checkpoint = tmp_path / "checkpoint-7"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text('{"global_step": 7}')
    (checkpoint / "optimizer.pt").write_bytes(b"PK\x03\x04 cut short")
    files, problem = saved_files(checkpoint)
    assert problem == "optimizer.pt: truncated (its zip directory is missing)"
    (checkpoint / "optimizer.pt").unlink()
    assert saved_files(checkpoint) == ({"trainer_state.json": {"size": 18, "checked": "json"}}, None)


# -- trainer_state.json of the wrong shape: valid JSON that resume cannot read ----------------------------------------

def same_size_state(path, change) -> None:
    """Rewrite the checkpoint's trainer_state.json with ``change`` applied, padded to the size the save recorded."""
    state = json.loads(path.read_text())
    change(state)
    text = json.dumps(state)
    size = path.stat().st_size
    assert len(text) <= size
    path.write_text(text + " " * (size - len(text)))


@pytest.mark.slow
@pytest.mark.parametrize("change, expected", [
    pytest.param(lambda s: s.update(global_step="2"), "trainer_state.json: global_step is '2', not a whole number",
                 id="step as text"),  # the rank's TypeError: unsupported operand type(s) for //
    pytest.param(lambda s: s.update(log_history={"loss": 1}), "trainer_state.json: log_history is a JSON dict, not a "
                 "list of objects", id="history"),
    pytest.param(lambda s: s.update(stateful_callbacks=[1]), "trainer_state.json: stateful_callbacks is a JSON list",
                 id="callbacks"),
    pytest.param(lambda s: s.pop("global_step"), "trainer_state.json: has no global_step", id="no step"),
])
def test_a_trainer_state_of_the_wrong_shape_is_refused_naming_the_file(checkpoints, change, expected) -> None:
    newest = checkpoints / "checkpoint-2"
    same_size_state(newest / "trainer_state.json", change)
    assert expected in checkpoint_problem(newest, verify=True)
    assert latest_complete_checkpoint(checkpoints) == checkpoints / "checkpoint-1"
    with pytest.raises(CheckpointRefused) as refused:
        resume_checkpoint(resumed(load_recipe(builtin_path("demo")), str(newest)), checkpoints.parent, 1, verify=True)
    assert str(newest) in str(refused.value) and expected in str(refused.value)


def test_the_trainer_state_fields_checked_are_transformers_own() -> None:
    import dataclasses

    from transformers import TrainerState

    from tuner.rundir.integrity import TRAINER_STATE_FIELDS

    assert set(TRAINER_STATE_FIELDS) == {field.name for field in dataclasses.fields(TrainerState)}


_STATE_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True),
                          st.text(max_size=5), st.lists(st.integers(), max_size=2),
                          st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def resume_reads(state: dict) -> bool:
    """Whether what transformers' resume does with a trainer state goes through (TrainerState(**state), the step
    arithmetic, the best checkpoint's folder, the callbacks' states, the history it appends to)."""
    import os

    from transformers import TrainerState

    try:
        loaded = TrainerState(**state)
        int(loaded.global_step // 3), loaded.global_step % 3
        if loaded.best_model_checkpoint is not None:
            os.path.isdir(loaded.best_model_checkpoint)
        for entry in loaded.stateful_callbacks.items():
            for one in entry[1] if isinstance(entry[1], list) else [entry[1]]:
                one.get("args", {}), one.get("attributes", {})
        loaded.log_history.append({"loss": 0.5})
    except (TypeError, AttributeError, ValueError):
        return False
    return "global_step" in state  # without it resume silently starts over at step 0


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_trainer_state_resume_cannot_read_is_named(data) -> None:
    """A state TrainerState writes passes; one with a field of another kind, a key TrainerState has not, or no
    global_step that resume cannot read is refused, naming the field or key."""
    import dataclasses

    from transformers import TrainerState

    from tuner.rundir.integrity import TRAINER_STATE_FIELDS, trainer_state_problem

    state = json.loads(json.dumps(dataclasses.asdict(TrainerState(
        global_step=data.draw(st.integers(0, 10 ** 6)), epoch=1.5, max_steps=10,
        log_history=[{"loss": 1.0, "step": 1}], train_batch_size=2))))
    assert trainer_state_problem(state) is None and resume_reads(dict(state))
    how = data.draw(st.sampled_from(["field", "key", "no step"]))
    key = "global_step"
    if how == "field":
        key = data.draw(st.sampled_from(sorted(TRAINER_STATE_FIELDS)))
        state[key] = data.draw(_STATE_VALUES)
    elif how == "key":
        key = data.draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in TRAINER_STATE_FIELDS))
        state[key] = 1
    else:
        del state["global_step"]
    problem = trainer_state_problem(state)
    if not resume_reads(dict(state)):
        assert problem is not None and repr(key)[1:-1][:40] in problem, (state, problem)
