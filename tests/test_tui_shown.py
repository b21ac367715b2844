"""Issue 49: the wizard shows what the draft and the plan say. Each test drives a reproduction through Pilot at
80x24 and 120x40 (it failed before the fix)."""
from __future__ import annotations

import pytest
from textual.widgets import Input, RadioButton

from tui_helpers import SIZES, in_tmp, make_app, pilot_test, settle, wait_until  # noqa: F401 (in_tmp: autouse)
from tuner.tui.widgets.fields import BUTTON_CELLS, ChoiceField

pytestmark = pytest.mark.slow  # drives the wizard through Pilot

def labels_whole(field: ChoiceField) -> None:
    """Every shown option is as wide as its label needs: never cut mid-word."""
    for choice, button in zip(field.choices, field.query(RadioButton)):
        if button.display:
            assert button.region.width >= len(choice.label) + BUTTON_CELLS, (field.id, choice.label, button.region)
            assert field.region.contains_region(button.region), (field.id, choice.label)


def pressed(field: ChoiceField) -> list[str]:
    return [choice.label for choice, button in zip(field.choices, field.query(RadioButton)) if button.value]


# 2 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_grpo_from_scratch_shows_the_chosen_reward_with_whole_labels(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await pilot.press("enter")  # New recipe
        await settle(pilot)
        app.switch_mode("method")
        await settle(pilot)
        objective = app.screen.query_one("#objective-kind", ChoiceField)
        objective.radio_set.focus()
        await pilot.press("right", "right", "right", "enter")  # sft -> dpo -> kto -> grpo
        await wait_until(pilot, lambda: app.draft.value("objective.kind") == "grpo")
        await settle(pilot)
        rewards = app.screen.query_one("#grpo-rewards", ChoiceField)
        assert pressed(rewards) == ["exact match (answer)"]
        for presses, label in ((1, "regex match (<answer>)"), (1, "exact match + length")):
            rewards.radio_set.focus()
            await pilot.press(*["right"] * presses, "enter")
            await settle(pilot)
            assert pressed(rewards) == [label], app.draft.value("objective.grpo.rewards")
        assert [reward.kind for reward in app.draft.value("objective.grpo.rewards")] == ["exact_match", "length"]
        for field in app.screen.query(ChoiceField):
            if field.display:
                labels_whole(field)


# 13: arrows -----------------------------------------------------------------------------------
@pilot_test
async def test_arrows_step_through_every_option_refused_ones_too_and_stop_at_the_ends():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("enter")  # New recipe: micro-batch 1, so kto is refused
        await settle(pilot)
        app.switch_mode("method")
        await settle(pilot)
        objective = app.screen.query_one("#objective-kind", ChoiceField)
        row = objective.radio_set
        assert objective.button("kto").disabled
        row.focus()
        await pilot.press("left")  # at the first option: stays
        assert row._selected == 0
        await pilot.press("right", "right")  # sft -> dpo -> kto: refused, still reachable (and marked)
        assert row._selected == 2
        await pilot.press("enter")  # says why, chooses nothing
        await settle(pilot)
        assert app.draft.value("objective.kind") == "sft" and pressed(objective) == ["sft"]
        await pilot.press("right", "right", "right", "right")  # -> grpo, reward, distill, then the end: no wrap to sft
        assert row._selected == 5
        await pilot.press("left", "left")  # back to grpo
        assert row._selected == 3
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.draft.value("objective.kind") == "grpo")


def visible(app, widget) -> bool:
    """Whole on screen: not cut by the terminal's edge nor scrolled out of any container."""
    region = widget.region
    return bool(region.area) and app.screen.region.contains_region(region) and all(
        ancestor.region.contains_region(region) for ancestor in widget.ancestors if hasattr(ancestor, "region")
        and ancestor is not app and ancestor.region.area)


def verdict_agrees(app, recipe) -> None:
    """The verdict line says what ``tuner plan`` says: its verdict, the training device's peak and headroom."""
    from tuner.planner import plan
    from tuner.tui.widgets.plan_bar import gib

    expected = plan(recipe)
    shown = str(app.screen.query_one("#verdict").render())
    device = expected.gpu
    assert f"verdict: {expected.verdict}" in shown, shown
    assert f"peak {gib(device.total_gib)}" in shown and f"headroom {gib(device.headroom_gib)}" in shown, shown


SEVENTY_B_FULL_ON_A_4090 = {"model": {"id": "meta-llama/Llama-3.1-70B"},
                            "hardware": {"gpus_per_machine": 1, "gpu": "RTX4090"}}


# 4 ------------------------------------------------------------------------------------------
@SIZES
@pytest.mark.parametrize("data", [SEVENTY_B_FULL_ON_A_4090, {"model": {"id": "builtin:demo"}}], ids=["70b", "demo"])
@pilot_test
async def test_review_shows_the_verdict_peak_and_headroom_of_every_recipe(size, data):
    from tuner.tui.draft import Draft

    app = make_app(Draft(data))
    async with app.run_test(size=size) as pilot:
        app.switch_mode("review")
        await settle(pilot)
        verdict_agrees(app, app.draft.recipe)
        assert visible(app, app.screen.query_one("#verdict"))
        if data is SEVENTY_B_FULL_ON_A_4090:
            assert "verdict: does not fit" in str(app.screen.query_one("#verdict").render())


# 5 ------------------------------------------------------------------------------------------
def words_whole(rendered: str, changes: list[str]) -> None:
    """Each rendered line is a piece of one change line that begins and ends between words (at a space, or after a
    dot of the field's name): a line never breaks inside a word."""
    def whole(piece: str, line: str) -> bool:
        start = line.find(piece)
        while start >= 0:
            end = start + len(piece)
            if (start == 0 or line[start - 1] in " .") and (end == len(line) or line[end] == " " or line[end - 1] == "."):
                return True
            start = line.find(piece, start + 1)
        return False

    for piece in rendered.splitlines()[1:]:  # under the heading
        assert any(whole(piece.strip(), change) for change in changes), (piece, changes)


@SIZES
@pilot_test
async def test_after_autofit_the_verdict_stays_in_view_and_changes_break_between_words(size):
    from tuner.tui.draft import Draft

    app = make_app(Draft({"model": {"id": "meta-llama/Llama-3.1-8B"},
                          "hardware": {"gpus_per_machine": 1, "gpu": "RTX4090", "host_ram_gb": 256}}))
    async with app.run_test(size=size) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        await pilot.press("f")
        await settle(pilot)
        screen = app.screen
        assert screen.alternatives and visible(app, screen.query_one("#verdict"))
        verdict_agrees(app, app.draft.recipe)
        listing = screen.query_one("#alternatives")
        for index, proposal in enumerate(screen.alternatives):
            if not proposal.advice.fits:
                continue
            listing.highlighted = index
            await settle(pilot)
            box = screen.query_one("#proposal")
            rendered = box.render().plain
            assert all(len(line) <= box.size.width for line in rendered.splitlines()), rendered
            words_whole(rendered, app.draft.describe_changes(proposal.changes))
            assert visible(app, screen.query_one("#verdict"))


def controls(screen) -> set[str]:
    """The recipe fields a control on ``screen`` edits."""
    from tuner.tui.widgets.fields import InputField, SelectField, ToggleField

    fields = {widget.field for widget in screen.query("InputField, SelectField, ToggleField")
              if isinstance(widget, (InputField, SelectField, ToggleField))}
    for choice_field in screen.query(ChoiceField):
        fields |= {field for choice in choice_field.choices for field in choice.changes}
    return fields


def refusals(screen) -> list[tuple[dict, str]]:
    """(what the option would change, the checker's reason ``field: why``) of every greyed-out option shown."""
    draft = screen.app.draft
    return [(choice.changes_for(draft), str(button.tooltip)) for field in screen.query(ChoiceField) if field.display
            for choice, button in zip(field.choices, field.query(RadioButton)) if button.display and button.disabled]


def liftable_here(screen, changes: dict, reason: str) -> bool:
    """Whether a control on ``screen`` lifts the refusal: it edits the field the reason names, or one of its own
    options makes the refused one acceptable (LoRA lifts fp16's refusal of full float16 weights)."""
    import copy

    from tuner.tui.draft import Draft

    if reason.split(": ", 1)[0] in controls(screen):
        return True
    draft = screen.app.draft
    for field in screen.query(ChoiceField):
        for choice, button in zip(field.choices, field.query(RadioButton)):
            if button.display and not button.disabled:
                other = Draft(copy.deepcopy(draft.data))
                other.apply(choice.changes_for(other))
                if other.refusal(changes) is None:
                    return True
    return False


MOE_ON_TWO_4090 = {"model": {"id": "Qwen/Qwen3-30B-A3B"}, "hardware": {"gpus_per_machine": 2, "gpu": "RTX4090"},
                   "memory": {"distributed": "ddp"}}


# 1 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_moe_lora_is_reachable_on_the_method_step_by_dropout_or_targets(size):
    from tuner.tui.draft import Draft

    app = make_app(Draft(MOE_ON_TWO_4090))
    async with app.run_test(size=size) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        screen = app.screen
        method = screen.query_one("#method-kind", ChoiceField)
        targets = screen.query_one("#lora-targets", ChoiceField)
        assert method.button("LoRA").disabled and "method.lora.dropout" in str(method.button("LoRA").tooltip)
        assert pressed(targets) == ["all linear"] and targets.button("attention + experts").display
        for changes, reason in refusals(screen):  # every refusal shown has the control that lifts it here
            assert liftable_here(screen, changes, reason), reason

        targets.radio_set.focus()
        await pilot.press("right", "enter")  # attention only: its linear layers, no fused experts
        await settle(pilot)
        assert app.draft.value("method.lora.target_modules") == ["q_proj", "k_proj", "v_proj", "o_proj"]
        assert pressed(targets) == ["attention"] and not method.button("LoRA").disabled

        await pilot.press("right", "enter")  # the experts too: PEFT wants dropout 0 for them
        await settle(pilot)
        assert app.draft.value("method.lora.target_parameters") == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
        assert pressed(targets) == ["attention + experts"] and method.button("LoRA").disabled
        dropout = screen.query_one("#method-lora-dropout-input", Input)
        dropout.focus()
        await pilot.press("home", "ctrl+k", "0")
        await settle(pilot)
        assert app.draft.value("method.lora.dropout") == 0 and not method.button("LoRA").disabled
        method.radio_set.focus()
        await pilot.press("right", "enter")  # Full -> LoRA
        await settle(pilot)
        assert app.draft.value("method.kind") == "lora" and app.draft.valid and app.plan is not None
        assert pressed(method) == ["LoRA"]


@pilot_test
async def test_a_dense_model_is_offered_no_experts():
    from tuner.tui.draft import Draft

    app = make_app(Draft({"model": {"id": "meta-llama/Llama-3.1-8B"}}))
    async with app.run_test(size=(120, 40)) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        targets = app.screen.query_one("#lora-targets", ChoiceField)
        assert not targets.button("attention + experts").display and targets.button("attention").display
        labels_whole(targets)


# 12 -----------------------------------------------------------------------------------------
@pilot_test
async def test_autofit_proposes_no_plan_needing_more_host_ram_than_this_machine_has():
    from tuner.tui.app import TunerApp
    from tuner.tui.detect import machine_ram_gib
    from tuner.tui.draft import Draft

    app = TunerApp(draft=Draft({**MOE_ON_TWO_4090, "method": {"allow_method_change": True}}))  # RAM not set
    async with app.run_test(size=(120, 40)) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        app.screen.query_one("#method-kind RadioSet").focus()
        await pilot.press("f")
        await settle(pilot)
        ram = machine_ram_gib()
        assert app.screen.alternatives
        for proposal in app.screen.alternatives:
            host = [device for device in proposal.advice.plan.devices if device.kind == "host"]
            if proposal.advice.fits:
                assert all(device.total_gib <= ram for device in host), (proposal.advice.label, ram)
            assert not any(field.startswith("hardware.") for field in proposal.changes)


# 13: Hardware -------------------------------------------------------------------------------
@pilot_test
async def test_hardware_box_and_label_agree_on_this_machines_ram_and_processes_are_named_after_the_gpus():
    from tuner.tui.app import TunerApp
    from tuner.tui.detect import machine_ram_gib

    app = TunerApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("enter")  # New recipe
        await settle(pilot)
        app.switch_mode("hardware")
        await settle(pilot)
        await wait_until(pilot, lambda: "host RAM:" in str(app.screen.query_one("#detected").render()))
        await settle(pilot)
        ram = machine_ram_gib()
        assert f"host RAM: {ram:g} GiB" in str(app.screen.query_one("#detected").render())
        box = app.screen.query_one("#hardware-host_ram_gb-input", Input)
        # the box and the label agree: the RAM shown, as the placeholder of a field the recipe leaves unset (a saved
        # recipe holds only what the user chose), until "Use this machine" writes it
        assert box.value == "" and f"this machine: {ram:g}" in box.placeholder
        assert app.draft.value("hardware.host_ram_gb") is None
        await pilot.click("#use-detected")
        await settle(pilot)
        assert box.value == f"{ram:g}" and app.draft.value("hardware.host_ram_gb") == ram
        label = app.screen.query_one("#hardware-num_processes .field-label")
        gpus = app.screen.query_one("#hardware-gpus_per_machine-input", Input)
        gpus.focus()
        await pilot.press("home", "ctrl+k", "2")
        await settle(pilot)
        assert app.draft.value("hardware.gpus_per_machine") == 2
        assert "CPU" not in str(label.render()) and "GPU" in str(label.render())
        await pilot.press("backspace", "0")
        await settle(pilot)
        assert str(label.render()) == "Processes (CPU)"


# 13: Model ----------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_an_opened_recipes_model_is_highlighted_rows_never_wrap_and_moe_facts_show_expert_width(size):
    from textual.widgets import OptionList

    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        actions = app.screen.query_one("#actions", OptionList)
        actions.focus()
        actions.highlighted = actions.get_option_index("builtin:llama3.1/70b-qlora")
        await pilot.press("enter")
        await settle(pilot)
        assert app.current_mode == "model"
        listing = app.screen.query_one("#model-list", OptionList)
        model_id = app.draft.value("model.id")
        assert model_id.startswith("meta-llama/Llama-3.1-70B")
        assert listing.get_option_at_index(listing.highlighted).id == model_id
        width = listing.scrollable_content_region.width
        for index in range(listing.option_count if size == (120, 40) else 0):  # 80 columns: id and size, may wrap
            prompt = str(listing.get_option_at_index(index).prompt)
            assert len(prompt) <= width or prompt == listing.get_option_at_index(index).id, (prompt, width)
        box = app.screen.query_one("#model-id-input", Input)
        box.focus()
        box.value = "Qwen/Qwen3-30B-A3B"
        await pilot.press("enter")
        await settle(pilot)
        facts = str(app.screen.query_one("#facts").render())
        assert "expert width" in facts and "768" in facts and "6144" not in facts, facts
