"""Issue 49: the wizard shows what the draft and the plan say. Each test drives a reproduction through Pilot at
80x24 and 120x40 (it failed before the fix)."""
from __future__ import annotations

import pytest
from textual.widgets import Input, RadioButton

from tui_helpers import make_app, pilot_test, settle, wait_until
from tuner.tui.widgets.fields import BUTTON_CELLS, ChoiceField

pytestmark = pytest.mark.slow  # drives the wizard through Pilot

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)
    return tmp_path


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
        await pilot.press("right", "right", "right")  # -> grpo, then the end: no wrap to sft
        assert row._selected == 3
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.draft.value("objective.kind") == "grpo")
