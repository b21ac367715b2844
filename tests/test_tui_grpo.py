"""The wizard's Method step offers grpo with its fields and a reward choice, and the plan bars show its rollout."""
from __future__ import annotations

import pytest

from tui_helpers import SIZE, demo_draft, make_app, pilot_test, settle, wait_until
from tuner.tui.screens.method_choices import OBJECTIVES
from tuner.tui.widgets.fields import ChoiceField
from tuner.tui.widgets.plan_bar import plan_text

pytestmark = pytest.mark.slow  # drives the wizard through Pilot


@pilot_test
async def test_grpo_is_chosen_with_its_fields_and_reward_and_the_plan_shows_generation(demo_model_path):
    app = make_app(demo_draft({"data.source": "builtin:reverse-prompts", "data.format": "prompt"}))
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        objective = app.screen.query_one("#objective-kind", ChoiceField)
        assert not app.screen.query_one("#grpo").display and not app.screen.query_one("#grpo-rewards").display
        assert objective.button("sft").disabled is False and objective.button("grpo").disabled is False
        objective.radio_set.focus()
        await pilot.press("right", "right", "right", "enter")  # sft -> dpo -> kto -> grpo
        await wait_until(pilot, lambda: app.draft.value("objective.kind") == "grpo" and app.plan is not None
                         and "generation" in app.plan.devices[0].phases)
        assert app.draft.valid and app.draft.value("training.micro_batch_size") == 8  # one group per micro-batch
        assert app.screen.query_one("#grpo").display and app.screen.query_one("#grpo-rewards").display
        assert app.screen.query_one("#preference").display  # beta, the KL penalty
        assert not app.screen.query_one("#objective-precompute_ref_log_probs").display
        assert [r.kind for r in app.draft.value("objective.grpo.rewards")] == ["exact_match"]

        app.screen.query_one("#grpo-rewards", ChoiceField).radio_set.focus()
        await pilot.press("right", "right", "enter")  # exact match -> regex match -> exact match + length
        await wait_until(pilot, lambda: len(app.draft.value("objective.grpo.rewards")) == 2)
        assert objective.button("grpo").value  # still the chosen objective, its starting reward changed
        app.screen.query_one("#objective-beta-input").value = "0.04"
        await wait_until(pilot, lambda: app.draft.value("objective.beta") == 0.04
                         and app.plan.devices[0].terms["reference_model"] > 0)
        shown = plan_text(app.plan, 60).plain
        assert "generation (" in shown and "reference model" in shown and "generation " in shown

        # back to sft (refused on this prompt data, so applied as the choice would): grpo's section leaves with it
        app.draft.apply(OBJECTIVES[0].changes)
        assert app.draft.value("objective.kind") == "sft" and app.draft.value("objective.grpo") is None
