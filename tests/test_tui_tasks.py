"""Tasks a user must be able to finish in the wizard: DPO from scratch (the objective brings data it can read, a
mismatch is shown on the Data step before launch), Auto-fit fixing the errors one choice fixes, labels that say
what Enter applies, and every choice offering exactly the schema's values."""
from __future__ import annotations

import json

import pytest
import yaml
from textual.widgets import Input, OptionList, Static

from tui_helpers import SIZE, in_tmp, make_app, pilot_test, settle, wait_until  # noqa: F401 (in_tmp: autouse)
from tuner.launch.run import prepare_run
from tuner.planner.advisor import change_label
from tuner.recipe.io import load_recipe
from tuner.recipe.objective import OBJECTIVE_DATA
from tuner.tui.draft import Draft, field_value, schema_values
from tuner.tui.screens.method_choices import OBJECTIVES
from tuner.tui.screens.confirm import ConfirmScreen
from tuner.tui.widgets.fields import Choice, ChoiceField, schema_choices, schema_labels

pytestmark = pytest.mark.slow  # drives the wizard through Pilot

STEPS = ["model", "hardware", "method", "data", "training", "review"]


async def visit(pilot, mode: str) -> None:
    pilot.app.switch_mode(mode)
    await settle(pilot)


async def choose(pilot, field: str, label: str) -> None:
    """Highlight ``label`` in the choice field and press enter, as the keyboard does."""
    choice = pilot.app.screen.query_one(f"#{field}", ChoiceField)
    choice.radio_set.focus()
    await settle(pilot)
    index = [c.label for c in choice.choices].index(label)
    choice.radio_set._selected = index  # the keyboard's highlight (arrows move it one by one)
    await pilot.press("enter")
    await settle(pilot)


def offered_values(choices) -> dict[str, list]:
    """Field -> the values ``choices`` set it to, in the order offered, each once (None, which removes the key,
    is no value)."""
    offered: dict[str, list] = {}
    for choice in choices:
        for field, value in choice.changes.items():
            if value is not None and value not in offered.setdefault(field, []):
                offered[field].append(value)
    return offered


def literal_items(values: list) -> list:
    """The Literal values among ``values``, a list field's items in place of its lists (the tracker's [] is none)."""
    items = [item for value in values for item in (value if isinstance(value, list) else [value])]
    return list(dict.fromkeys(items))


def literal_values(field: str) -> tuple | None:
    """The schema's Literal values of ``field``, or None for a field that has no Literal (a number, a section)."""
    try:
        return schema_values(field)
    except TypeError:
        return None


@pilot_test
async def test_every_choice_offers_exactly_its_schema_fields_values():
    """Every choice field of every step, against the schema: a Literal field offers all its values in the schema's
    order (a screen that retypes the list, with one missing, one extra or reordered, fails), any other value a
    choice sets passes its field's own rule (a reward kind, a quantization's bits)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        walked = set()
        for mode in STEPS:
            await visit(pilot, mode)
            for widget in app.screen.query(ChoiceField):
                for field, values in offered_values(widget.choices).items():
                    allowed = literal_values(field)
                    if allowed is None:
                        assert [field_value(field, value)[1] for value in values] == [None] * len(values), field
                    else:
                        walked.add(field)
                        assert literal_items(values) == list(allowed), (widget.id, field)
    assert {"data.format", "objective.kind", "memory.distributed", "memory.zero_stage", "training.optimizer",
            "memory.attention", "memory.mixed_precision", "memory.offload_optimizer", "memory.offload_params",
            "memory.fsdp.sharding_strategy", "training.report_to", "training.lr_scheduler", "method.kind"} <= walked


def test_the_walk_refuses_a_retyped_list_that_differs_from_the_schema():
    """What the walk above compares: a hand-typed list missing one value, or in another order, is not the
    schema's; a reward of a kind the schema lacks fails its field's rule."""
    assert offered_values(schema_choices("data.format")) == {"data.format": list(schema_values("data.format"))}
    retyped = [Choice(value, {"data.format": value}) for value in ("auto", "text", "instruction", "chat")]
    assert literal_items(offered_values(retyped)["data.format"]) != list(literal_values("data.format"))
    reordered = [Choice(value, {"memory.attention": value}) for value in reversed(schema_values("memory.attention"))]
    assert literal_items(offered_values(reordered)["memory.attention"]) != list(literal_values("memory.attention"))
    assert literal_values("objective.grpo.rewards") is None
    assert field_value("objective.grpo.rewards", [{"kind": "exact", "column": "answer"}])[1] is not None


def test_labels_for_other_values_than_the_schemas_fail():
    with pytest.raises(ValueError, match="method.kind"):
        schema_labels("method.kind", {"full": "Full", "lora": "LoRA"})  # qlora missing
    with pytest.raises(ValueError, match="memory.distributed"):
        schema_labels("memory.distributed", {"none": "Single", "ddp": "DDP", "fsdp": "FSDP", "deepspeed": "ZeRO",
                                             "megatron": "Megatron"})  # a value the schema lacks


@pytest.mark.parametrize("kind", [kind for kind, data in OBJECTIVE_DATA.items() if data.example])
def test_choosing_an_objective_on_a_new_recipe_brings_data_it_trains_on(kind):
    draft = Draft()
    choice = next(choice for choice in OBJECTIVES if choice.changes["objective.kind"] == kind)
    draft.apply(choice.changes_for(draft))
    assert draft.valid, draft.errors
    assert draft.value("data.source") == OBJECTIVE_DATA[kind].example


def test_a_reward_model_after_dpo_keeps_the_pairs_and_drops_the_beta_and_loss_it_has_no_use_for():
    draft = Draft()
    for kind, typed in (("dpo", {"objective.beta": 0.3, "objective.loss_type": "ipo"}), ("reward", {})):
        choice = next(choice for choice in OBJECTIVES if choice.changes["objective.kind"] == kind)
        draft.apply({**choice.changes_for(draft), **typed})
        assert draft.valid, draft.errors
    assert draft.value("data.source") == OBJECTIVE_DATA["reward"].example == OBJECTIVE_DATA["dpo"].example
    assert draft.value("objective.beta") is None and draft.value("objective.loss_type") is None


@pilot_test
async def test_save_as_a_folder_or_into_a_missing_folder_says_why_without_asking_or_creating(in_tmp):
    (in_tmp / "recipes").mkdir()
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await visit(pilot, "review")
        for target, message in (("recipes", "is a folder"), ("missing/x.yaml", "no such folder")):
            app.screen.query_one("#save-path", Input).value = target
            await pilot.press("ctrl+s")
            await settle(pilot)
            assert not isinstance(app.screen, ConfirmScreen)  # no overwrite question
            assert any(message in str(note.message) for note in app._notifications), target
    assert sorted(path.name for path in in_tmp.rglob("*")) == ["recipes"]  # nothing created


def test_every_objective_has_its_data_layouts_and_every_layout_an_objective():
    assert set(OBJECTIVE_DATA) == set(schema_values("objective.kind"))
    layouts = {layout for data in OBJECTIVE_DATA.values() for layout in data.formats}
    assert layouts == set(schema_values("data.format")) - {"auto"}
    shared = {layout for layout in layouts if sum(layout in data.formats for data in OBJECTIVE_DATA.values()) > 1}
    # distill reads SFT's completions and reward DPO's pairs; no other layout is shared
    assert shared <= set(OBJECTIVE_DATA["sft"].formats) | set(OBJECTIVE_DATA["reward"].formats)


@pilot_test
async def test_dpo_from_scratch_brings_pairs_and_saves_only_what_was_chosen(in_tmp, demo_model_path):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("enter")  # New recipe
        await settle(pilot)
        await visit(pilot, "method")
        await choose(pilot, "objective-kind", "dpo")
        assert app.draft.value("objective.kind") == "dpo"
        assert app.draft.value("data.source") == OBJECTIVE_DATA["dpo"].example
        await visit(pilot, "data")
        format_line = app.screen.query_one("#preview-format", Static)
        await wait_until(pilot, lambda: "format: preference" in str(format_line.render()), timeout=120)
        assert not app.screen.query_one("#errors", Static).display
        await visit(pilot, "review")
        app.screen.query_one("#save-path", Input).value = "dpo.yaml"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: (in_tmp / "dpo.yaml").exists())
    assert yaml.safe_load((in_tmp / "dpo.yaml").read_text()) == {
        "version": 2, "objective": {"kind": "dpo"}, "data": {"source": "builtin:reverse-pairs"}}
    prepared = prepare_run(load_recipe(in_tmp / "dpo.yaml"), dry_run=True)  # the checks a launch runs first
    assert prepared.launchable


@pilot_test
async def test_data_the_objective_cannot_read_is_an_error_on_the_data_step(in_tmp, demo_model_path):
    rows = in_tmp / "mine.jsonl"
    rows.write_text("".join(json.dumps({"instruction": "reverse", "input": w, "output": w[::-1]}) + "\n"
                            for w in ("abc", "hello", "tuner", "words")))
    app = make_app(Draft({"objective": {"kind": "dpo"}, "data": {"source": str(rows)}}))
    async with app.run_test(size=SIZE) as pilot:
        await visit(pilot, "data")
        errors = app.screen.query_one("#errors", Static)
        await wait_until(pilot, lambda: errors.display, timeout=120)
        assert "preference needs the column(s)" in str(errors.render())
        await visit(pilot, "method")
        await choose(pilot, "objective-kind", "sft")  # the user's own data stays; sft reads it
        await visit(pilot, "data")
        await wait_until(pilot, lambda: "format: instruction" in str(
            app.screen.query_one("#preview-format", Static).render()), timeout=120)
        assert not errors.display and app.draft.value("data.source") == str(rows)


def labels_are_what_enter_applies(app) -> None:
    screen = app.screen
    assert screen.alternatives
    for alternative in screen.alternatives:
        after = Draft(app.draft.data)
        after.apply(alternative.changes)
        assert alternative.advice.label == change_label(app.draft.resolved, after.resolved)


@pilot_test
async def test_autofit_fixes_what_one_choice_fixes_and_each_label_is_what_enter_applies():
    """Eight GPUs and no distribution chosen: Auto-fit offers the plans that fit with one, named by their changes."""
    app = make_app(Draft({"model": {"id": "meta-llama/Llama-3.1-8B"},
                          "hardware": {"gpus_per_machine": 8, "gpu": "A100-80GB", "host_ram_gb": 512}}))
    async with app.run_test(size=SIZE) as pilot:
        await visit(pilot, "method")
        assert "8 processes need a way to share the work" in app.draft.reason("memory.distributed")
        app.screen.query_one("#method-kind").radio_set.focus()
        await pilot.press("f")
        await settle(pilot)
        listing = app.screen.query_one("#alternatives", OptionList)
        assert listing.option_count and all(alternative.advice.fits for alternative in app.screen.alternatives)
        labels_are_what_enter_applies(app)
        first = app.screen.alternatives[0]
        assert str(listing.get_option_at_index(0).prompt).startswith(f"1. {first.advice.label}: ")
        listing.focus()
        await pilot.press("enter")
        await settle(pilot)
        assert app.draft.valid and app.plan.fits
        assert app.draft.value("memory.distributed") != "none"


@pilot_test
async def test_autofit_labels_name_the_degrees_and_the_accumulation_they_set():
    """Long sequences on four GPUs: plans that split them say sp 4 and the accumulation that keeps the batch."""
    app = make_app(Draft({"model": {"id": "meta-llama/Llama-3.1-8B"}, "memory": {"distributed": "ddp"},
                          "training": {"max_seq_length": 65536},
                          "hardware": {"gpus_per_machine": 4, "gpu": "A100-80GB", "host_ram_gb": 256}}))
    async with app.run_test(size=SIZE) as pilot:
        await visit(pilot, "method")
        app.screen.query_one("#method-kind").radio_set.focus()
        await pilot.press("f")
        await settle(pilot)
        labels_are_what_enter_applies(app)
        split = [a for a in app.screen.alternatives if a.changes.get("parallelism.sp", 1) > 1]
        assert split, [a.advice.label for a in app.screen.alternatives]
        for alternative in split:
            degree, accumulation = alternative.changes["parallelism.sp"], alternative.changes.get(
                "training.gradient_accumulation_steps")
            assert f"sp {degree}" in alternative.advice.label
            assert accumulation is None or f"accumulation {accumulation}" in alternative.advice.label
