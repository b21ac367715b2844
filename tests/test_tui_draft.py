"""The wizard's draft recipe: sparse user values, rules from the core, saving that never overwrites unasked."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tuner.recipe.io import load_recipe
from tuner.recipe.source import RecipeError
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
    draft.apply({"training.micro_batch_size": "lots"}, typed="lots")
    assert not draft.valid and draft.recipe is None
    assert draft.errors == ["training.micro_batch_size: Input should be a valid integer, "
                            "unable to parse string as an integer (got 'lots')."]
    assert draft.refusal({"memory.attention": "eager"}) is None
    assert draft.shown("training.micro_batch_size") == "lots"  # what was typed stays on show
    assert draft.value("training.micro_batch_size") == 1 and draft.data == {}  # and never enters the recipe


def test_a_conflict_keeps_every_value_the_user_chose():
    """Eight GPUs with one process: the form keeps 8 and the GPU type; the conflict names the field to change."""
    draft = Draft()
    draft.apply({"hardware.gpus_per_machine": 8}, typed="8")
    draft.apply({"hardware.gpu": "A100-80GB"})
    assert draft.shown("hardware.gpus_per_machine") == "8" and draft.value("hardware.gpu") == "A100-80GB"
    assert draft.reason("memory.distributed").startswith("memory.distributed: 8 processes need a way to share")
    assert draft.recipe is None and draft.plannable is None
    draft.apply({"memory.distributed": "ddp"})
    assert draft.valid and draft.data == {"hardware": {"gpus_per_machine": 8, "gpu": "A100-80GB"},
                                          "memory": {"distributed": "ddp"}}


def test_a_proposal_becomes_only_the_fields_it_changes():
    from tuner.planner import advise

    draft = Draft({"name": "mine", "model": {"id": "meta-llama/Llama-3.1-8B"},
                   "hardware": {"gpus_per_machine": 1, "gpu": "RTX4090", "host_ram_gb": 256}})
    fitting = [advice for advice in advise(draft.recipe) if advice.fits]
    changes = draft.changes_towards(fitting[0].recipe)
    assert changes and all(field.startswith(("memory.", "method.")) for field in changes)
    draft.apply(changes)
    assert draft.recipe.memory == fitting[0].recipe.memory
    assert "output" not in draft.data and "num_processes" not in draft.data["hardware"]
    draft.apply({"name": "renamed"})
    assert draft.value("output.dir") == "runs/renamed"  # defaults still follow


def test_save_writes_what_the_user_chose_and_never_overwrites_unasked(tmp_path):
    draft = Draft({"name": "saved", "method": {"kind": "lora"}, "memory": {"host_typo": 1}})
    assert not draft.valid
    with pytest.raises(RecipeError):
        draft.save(tmp_path / "refused.yaml")
    draft = Draft({"name": "saved", "method": {"kind": "lora"}})
    target = tmp_path / "saved.yaml"
    draft.save(target)
    assert target.read_text() == "version: 2\nname: saved\nmethod:\n  kind: lora\n"
    assert load_recipe(target) == draft.recipe
    with pytest.raises(FileExistsError):
        draft.save(target)
    draft.apply({"method.lora.r": 8})
    draft.save(target, overwrite=True)
    assert load_recipe(target).method.lora.r == 8


def test_numbers_show_as_typed():
    draft = Draft({"hardware": {"host_ram_gb": 512}})
    assert draft.shown("hardware.host_ram_gb") == "512"  # a float field, never "512.0"
    draft.apply({"training.learning_rate": 1e-4}, typed="1e-4")
    assert draft.shown("training.learning_rate") == "1e-4" and draft.value("training.learning_rate") == 1e-4


def test_importing_the_app_loads_no_heavy_library():
    """The first screen must paint fast: torch, transformers and datasets load only in workers, the recipe's
    schema (pydantic) and the planner after the first paint."""
    code = ("import sys, tuner.tui.app; heavy = [m for m in ('torch', 'transformers', 'datasets', 'accelerate', "
            "'tuner.recipe.schema', 'tuner.planner') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_wizards_model_modules_do_not_import_textual():
    """Draft, planning, run state, catalog and GPU detection are plain Python, usable and testable without a UI."""
    code = ("import sys, tuner.tui.draft, tuner.tui.planning, tuner.tui.run_watch, tuner.tui.catalog, tuner.tui.detect; "
            "print('textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def type_keys(draft: Draft, field: str, text: str, number: bool = True) -> None:
    """``text`` typed into the field's empty box one key at a time, as the box hands each text to the draft."""
    from tuner.tui.widgets.fields import _parse_number, _parse_text

    parse = _parse_number if number else _parse_text
    draft.apply({field: parse("")}, typed="")
    for end in range(1, len(text) + 1):
        draft.apply({field: parse(text[:end])}, typed=text[:end])


def test_a_refused_value_leaves_nothing_of_itself_in_the_recipe():
    draft = Draft({"hardware": {"machines": 2}})
    type_keys(draft, "hardware.machines", "99999999999")  # 9, 99 and 999 pass on the way
    assert draft.data == {"hardware": {"machines": 2}} and draft.plannable is None
    type_keys(draft, "name", "my run", number=False)  # "my" passes on the way
    assert draft.value("name") == "run" and draft.value("output.dir") == "runs/run"
    assert draft.shown("name") == "my run" and draft.shown("hardware.machines") == "99999999999"


def test_a_box_that_ends_as_it_began_changes_nothing():
    draft = Draft()
    for text in ("1 ", "1"):  # a space typed and deleted
        draft.apply({"training.micro_batch_size": int(text)}, typed=text)
    draft.apply({"hardware.num_processes": 1}, typed="1")  # enter in the box: its text as it was
    assert draft.data == {}
    draft.apply({"training.micro_batch_size": 4}, typed="4")
    draft.apply({"training.micro_batch_size": 1}, typed="1")  # and back: the default stays implicit
    assert draft.data == {}


def test_whole_numbers_are_saved_as_integers_where_the_field_holds_integers():
    draft = Draft()
    type_keys(draft, "hardware.machines", "1.")
    type_keys(draft, "training.max_seq_length", "1e3")
    type_keys(draft, "hardware.host_ram_gb", "512")
    assert draft.data == {"hardware": {"machines": 1, "host_ram_gb": 512}, "training": {"max_seq_length": 1000}}
    assert all(type(value) is int for section in draft.data.values() for value in section.values())
    assert draft.shown("training.max_seq_length") == "1e3"  # shown as typed


def test_text_held_for_enter_is_shown_but_not_yet_in_the_recipe():
    draft = Draft()
    draft.hold("model.id", "meta-llama/Llama-3.1-8")
    assert draft.shown("model.id") == "meta-llama/Llama-3.1-8" and draft.value("model.id") == "builtin:demo"
