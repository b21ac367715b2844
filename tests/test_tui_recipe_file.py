"""Saving from the wizard: an opened recipe keeps its comments, key order and number spelling (only the edited
keys change, as ``tuner validate`` of before and after shows), and Save as never writes where it should not."""
from __future__ import annotations

import difflib
import os

import pytest
import yaml

from tuner.cli import main as tuner_main
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_names, builtin_path
from tuner.tui.draft import Draft
from tuner.tui.recipe_file import SaveRefused, edited_text, save_problem

# one change of a value the file has or not, one key back to its default, typed as a user types them
EDITS = [("training.learning_rate", 3e-05, "3e-5"), ("hardware.host_ram_gb", 1000, "1000"),
         ("training.warmup_steps", None, "")]


def flat(data, prefix=""):
    out = {}
    for key, value in data.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def validated(path, capsys) -> dict:
    assert tuner_main(["validate", str(path)]) == 0
    return flat(yaml.safe_load(capsys.readouterr().out))


def opened(name: str) -> Draft:
    draft = Draft.from_file(builtin_path(name))
    draft.path = None  # a copy, as the Start screen opens a built-in recipe
    return draft


@pytest.mark.parametrize("name", builtin_names())
def test_a_built_in_recipe_saved_unchanged_is_the_same_file(name, tmp_path):
    target = opened(name).save(tmp_path / "same.yaml")
    assert target.read_text() == builtin_path(name).read_text()


@pytest.mark.parametrize("name", builtin_names())
def test_an_edited_built_in_recipe_changes_only_the_edited_keys(name, tmp_path, capsys):
    original = builtin_path(name).read_text()
    draft = opened(name)
    for field, value, text in EDITS:
        draft.apply({field: value}, typed=text)
    assert draft.valid, draft.errors
    saved = draft.save(tmp_path / "edited.yaml").read_text()

    edited_keys = {field.rsplit(".", 1)[1] for field, _, _ in EDITS}
    changed = [line for line in difflib.ndiff(original.splitlines(), saved.splitlines()) if line[:2] in ("- ", "+ ")]
    assert all(line[2:].strip().split(":")[0] in edited_keys for line in changed), changed
    comments = [line for line in original.splitlines() if "#" in line and "warmup_steps" not in line]
    assert all(line in saved.splitlines() for line in comments)  # every comment, where it was

    before, after = validated(builtin_path(name), capsys), validated(tmp_path / "edited.yaml", capsys)
    differing = {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}
    assert differing <= {field for field, _, _ in EDITS}
    assert after["training.learning_rate"] == 3e-05 and after["hardware.host_ram_gb"] == 1000
    assert after["training.warmup_steps"] == 0  # the default again


TEXT = """\
# my recipe
version: 1
name: mine
hardware:
    gpus_per_machine: 8  # eight
    gpu: A100-80GB
# how it trains
memory:
    distributed: deepspeed
    zero_stage: 3  # all of it
    # the batch, measured
    micro_batch_size: 2
training:
    learning_rate: 1.0e-4
    report_to:
      - tensorboard
"""


def test_comments_stay_with_what_they_describe_when_keys_come_and_go():
    before = yaml.safe_load(TEXT)
    after = yaml.safe_load(TEXT)
    after["hardware"]["host_ram_gb"] = 512  # after gpu, which the "# how it trains" line follows
    after["memory"]["distributed"] = "ddp"
    del after["memory"]["zero_stage"]  # its own comment goes with it, the next key's stays
    after["objective"] = {"kind": "dpo"}  # a new section where the schema puts it
    after["training"]["learning_rate"] = 1e-05
    text = edited_text(TEXT, before, after)
    assert text == """\
# my recipe
version: 1
name: mine
objective:
    kind: dpo
hardware:
    gpus_per_machine: 8  # eight
    gpu: A100-80GB
    host_ram_gb: 512
# how it trains
memory:
    distributed: ddp
    # the batch, measured
    micro_batch_size: 2
training:
    learning_rate: 1.0e-05
    report_to:
      - tensorboard
"""
    assert yaml.safe_load(text) == after  # tuner's YAML 1.1 loader reads it back as written


def test_text_that_yaml_would_read_as_something_else_is_quoted():
    before = {"name": "x", "memory": {"mixed_precision": "bf16"}}
    after = {"name": "yes", "memory": {"mixed_precision": "no"}}
    text = edited_text("name: x\nmemory:\n  mixed_precision: bf16\n", before, after)
    assert yaml.safe_load(text) == after


def test_save_as_a_folder_a_missing_folder_or_an_unwritable_place_says_why_and_creates_nothing(tmp_path):
    draft = Draft({"name": "mine"})
    (tmp_path / "existing").mkdir()
    cases = {tmp_path / "existing": "is a folder; give a file name",
             tmp_path / "missing" / "deeper" / "x.yaml": "no such folder; create it first",
             tmp_path / "existing" / "x.yaml" / "y.yaml": "no such folder"}
    for target, message in cases.items():
        assert message in save_problem(target)
        with pytest.raises(SaveRefused, match=message.split(";")[0]):
            draft.save(target)
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["existing"]  # nothing created
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "permission denied" in save_problem(locked / "x.yaml")
    with pytest.raises(SaveRefused, match="cannot write"):  # a place no permission check sees: /proc
        draft.save(__import__("pathlib").Path("/proc/tuner-recipe.yaml"))
    saved = draft.save(tmp_path / "existing" / "mine.yaml")
    assert load_recipe(saved).name == "mine"
