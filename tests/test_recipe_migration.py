"""Recipes of schema version 1 keep loading: batch, sequence and optimizer moved from memory: to training: (version 2),
each read from where it was written with a warning naming the line, the old key and the new one; a newer recipe is
refused."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from tuner.recipe.io import load_recipe, parse_yaml
from tuner.recipe.migration import MOVED, migrate
from tuner.recipe.registry import builtin_names, builtin_path
from tuner.recipe.schema import SCHEMA_VERSION
from tuner.recipe.source import RecipeError
from tuner.tui.draft import Draft

VERSION_1 = """\
version: 1
name: old
memory:
  gradient_checkpointing: true  # the user's own note
  micro_batch_size: 4
  gradient_accumulation_steps: 8
  max_seq_length: 128
  optimizer: adamw_torch
training:
  max_steps: 3
"""


def _write(tmp_path, text, name="old.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_version_1_recipe_loads_with_its_values_under_training_and_one_warning_per_key(tmp_path, caplog):
    path = _write(tmp_path, VERSION_1)
    with caplog.at_level(logging.WARNING, logger="tuner.recipe.io"):
        recipe = load_recipe(path)
    assert (recipe.version, recipe.training.micro_batch_size, recipe.training.gradient_accumulation_steps,
            recipe.training.max_seq_length, recipe.training.optimizer) == (SCHEMA_VERSION, 4, 8, 128, "adamw_torch")
    assert recipe.memory.gradient_checkpointing and recipe.training.max_steps == 3
    assert [record.getMessage() for record in caplog.records] == [
        f"{path}:5: memory.micro_batch_size is now training.micro_batch_size (recipe version 2); read from there. "
        "Move it under training: to silence this.",
        f"{path}:6: memory.gradient_accumulation_steps is now training.gradient_accumulation_steps (recipe version 2); "
        "read from there. Move it under training: to silence this.",
        f"{path}:7: memory.max_seq_length is now training.max_seq_length (recipe version 2); read from there. "
        "Move it under training: to silence this.",
        f"{path}:8: memory.optimizer is now training.optimizer (recipe version 2); read from there. "
        "Move it under training: to silence this."]


def test_the_cli_prints_the_warning_and_still_accepts_the_recipe(tmp_path):
    path = _write(tmp_path, VERSION_1)
    done = subprocess.run([sys.executable, "-m", "tuner", "validate", str(path)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{path}:5: memory.micro_batch_size is now training.micro_batch_size" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_old_override_is_moved_too_and_named_as_the_override(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tuner.recipe.io"):
        recipe = load_recipe(builtin_path("demo"), ["memory.micro_batch_size=3"])
    assert recipe.training.micro_batch_size == 3
    assert caplog.records[0].getMessage().startswith("--set memory.micro_batch_size: memory.micro_batch_size is now "
                                                     "training.micro_batch_size")


def test_a_bad_value_at_the_old_key_points_at_the_line_it_was_written_on(tmp_path):
    path = _write(tmp_path, "name: old\nmemory:\n  attention: sdpa\n  micro_batch_size: four\n")
    with pytest.raises(RecipeError, match=rf"{path}:4: training.micro_batch_size: .*integer"):
        load_recipe(path)


def test_a_key_set_in_both_places_is_refused_naming_both_lines(tmp_path):
    path = _write(tmp_path, "name: old\nmemory:\n  micro_batch_size: 2\ntraining:\n  micro_batch_size: 4\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert str(caught.value) == (f"{path}:3: memory.micro_batch_size: moved to training.micro_batch_size in recipe "
                                 f"version 2, which {path}:5 also sets; keep only training.micro_batch_size.")


def test_a_recipe_newer_than_this_tuner_is_refused_with_exit_2(tmp_path):
    path = _write(tmp_path, f"version: {SCHEMA_VERSION + 1}\nname: future\n")
    with pytest.raises(RecipeError, match=rf"{path}:1: version: {SCHEMA_VERSION + 1} is a newer recipe schema"):
        load_recipe(path)
    done = subprocess.run([sys.executable, "-m", "tuner", "validate", str(path)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "upgrade tuner" in done.stderr


def test_every_shipped_recipe_is_written_in_todays_keys():
    for name in builtin_names():
        data, source = parse_yaml(builtin_path(name).read_text(), name)
        assert migrate(data, source) == [], name
        assert data.get("version", SCHEMA_VERSION) == SCHEMA_VERSION, name


def test_every_moved_key_exists_at_its_new_place_and_not_at_its_old_one():
    from tuner.recipe.io import section_model
    from tuner.recipe.schema import Recipe

    for old, (new, since) in MOVED.items():
        assert since <= SCHEMA_VERSION
        assert new[-1] in section_model(Recipe, new[0]).model_fields
        assert old[-1] not in section_model(Recipe, old[0]).model_fields


def test_the_wizard_opens_a_version_1_file_in_todays_keys_and_its_save_moves_them(tmp_path):
    path = _write(tmp_path, VERSION_1)
    draft = Draft.from_file(path)
    assert draft.valid and draft.value("training.micro_batch_size") == 4
    draft.apply({"training.max_steps": 5})
    saved = draft.save(tmp_path / "saved.yaml")
    text = saved.read_text()
    assert "version: 2" in text and "gradient_checkpointing: true  # the user's own note" in text
    data, source = parse_yaml(text, str(saved))
    assert migrate(data, source) == []  # nothing left at the old keys
    recipe = load_recipe(saved)
    assert (recipe.training.micro_batch_size, recipe.training.gradient_accumulation_steps, recipe.training.max_steps,
            recipe.memory.gradient_checkpointing) == (4, 8, 5, True)
