"""The wizard's draft recipe: sparse user values, rules from the core, saving that never overwrites unasked."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tuner.recipe.io import load_recipe, recipe_to_yaml
from tuner.tui.draft import Draft


def test_defaults_follow_later_changes_because_only_user_values_are_kept():
    draft = Draft()
    assert draft.value("model.dtype") == "bfloat16"
    draft.apply({"memory.mixed_precision": "no"})
    assert draft.value("model.dtype") == "float32"
    assert draft.data == {"memory": {"mixed_precision": "no"}}
    draft.apply({"name": "mine"})
    assert draft.value("output.dir") == "runs/mine"


def test_refusal_names_the_rule_of_the_core_checks():
    draft = Draft()
    assert "FSDP needs GPUs" in draft.refusal({"memory.distributed": "fsdp"})
    assert "offload needs ZeRO or FSDP" in draft.refusal({"memory.offload_optimizer": "cpu"})
    assert draft.refusal({"memory.distributed": "deepspeed", "memory.zero_stage": 2}) is None
    draft.apply({"memory.distributed": "deepspeed", "memory.zero_stage": 2})
    assert draft.refusal({"memory.offload_optimizer": "cpu"}) is None


def test_an_existing_error_does_not_disable_unrelated_choices():
    draft = Draft()
    draft.apply({"memory.micro_batch_size": "lots"})
    assert not draft.valid
    assert draft.errors == ["recipe: memory.micro_batch_size: Input should be a valid integer, "
                            "unable to parse string as an integer (got 'lots')."]
    assert draft.refusal({"memory.attention": "eager"}) is None
    assert draft.value("memory.micro_batch_size") == 1  # the last valid recipe stays on show


def test_save_writes_the_resolved_recipe_and_never_overwrites_unasked(tmp_path):
    draft = Draft({"name": "saved", "method": {"kind": "lora"}})
    target = tmp_path / "saved.yaml"
    draft.save(target)
    assert target.read_text() == recipe_to_yaml(draft.recipe)
    assert load_recipe(target) == draft.recipe
    with pytest.raises(FileExistsError):
        draft.save(target)
    draft.apply({"method.lora.r": 8})
    draft.save(target, overwrite=True)
    assert load_recipe(target).method.lora.r == 8


def test_importing_the_app_loads_no_heavy_library():
    """The first screen must paint fast: torch, transformers and datasets load only in workers."""
    code = ("import sys, tuner.tui.app; heavy = [m for m in ('torch', 'transformers', 'datasets', 'accelerate') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_wizards_model_modules_do_not_import_textual():
    """Draft, planning, run state, catalog and GPU detection are plain Python, usable and testable without a UI."""
    code = ("import sys, tuner.tui.draft, tuner.tui.planning, tuner.tui.run_watch, tuner.tui.catalog, tuner.tui.detect; "
            "print('textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
