"""The wizard shows what the draft and the plan say, driven at random (issue 49): screen visits, recipes opened
(a MoE model on two 4090s, a 70B model that does not fit, GRPO), Auto-fit applied, bursts of keys on a choice and
terminal resizes (any size between 80x24 and 120x40, and odd ones on either side of the 100-column break:
81x25, 99x30, 100x30).  After every step, a resize included:

- every visible box shows the draft's text for its field;
- every visible choice marks the option the recipe holds, by an oracle that knows nothing of the widgets: the first
  shown option whose values, applied to a copy of the recipe, change nothing it resolves to (an objective: its kind;
  ``auto`` weights: what the recipe writes), and no option where none is held;
- the verdict line says what ``tuner plan`` says of the recipe: its verdict, the training device's peak and
  headroom (or why there is no plan);
- the screen is laid out for the terminal's width (its ``-narrow`` class below 100 columns).
"""
from __future__ import annotations

import asyncio
import copy
import os

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from textual.widgets import OptionList, RadioButton

from tui_helpers import choice_held, in_tmp, make_app, settle  # noqa: F401 (in_tmp: autouse)
from tuner.tui.app import NARROW_BELOW
from tuner.tui.draft import Draft
from tuner.tui.widgets.fields import ChoiceField, InputField
from tuner.tui.widgets.plan_bar import gib

pytestmark = pytest.mark.slow  # drives the wizard through Pilot over generated sessions

RECIPES = {
    "moe": {"model": {"id": "Qwen/Qwen3-30B-A3B"}, "hardware": {"gpus_per_machine": 2, "gpu": "RTX4090"},
            "memory": {"distributed": "ddp"}},
    "70b": {"model": {"id": "meta-llama/Llama-3.1-70B"}, "hardware": {"gpus_per_machine": 1, "gpu": "RTX4090"}},
    "grpo": {"model": {"id": "builtin:demo"}, "objective": {"kind": "grpo", "grpo": {"rewards": [
        {"kind": "regex_match", "column": "answer", "pattern": "<answer>(.*?)</answer>"}]}},
             "data": {"source": "builtin:reverse-prompts", "format": "prompt"}, "training": {"micro_batch_size": 8}},
    "8b": {"model": {"id": "meta-llama/Llama-3.1-8B"},
           "hardware": {"gpus_per_machine": 1, "gpu": "RTX4090", "host_ram_gb": 256}},
}
SCREENS = ["model", "hardware", "method", "review"]
CHOICES = ["method-kind", "lora-targets", "objective-kind", "grpo-rewards", "distribution", "precision", "model-dtype",
           "optimizer"]
KEYS = ["left", "right", "right", "enter", "space", "down", "up"]
ODD_SIZES = [(80, 24), (81, 25), (99, 30), (100, 30), (120, 40)]  # the ends, one over them, both sides of the break

actions = st.one_of(
    st.tuples(st.just("visit"), st.sampled_from(SCREENS)),
    st.tuples(st.just("open"), st.sampled_from(sorted(RECIPES))),
    st.tuples(st.just("autofit"), st.integers(0, 3)),
    st.tuples(st.just("keys"), st.sampled_from(CHOICES), st.lists(st.sampled_from(KEYS), min_size=1, max_size=6)),
    st.tuples(st.just("resize"), st.one_of(st.sampled_from(ODD_SIZES), st.tuples(st.integers(80, 120),
                                                                                 st.integers(24, 40)))),
)


def shown(widget) -> bool:
    return all(getattr(node, "display", True) for node in widget.ancestors_with_self)


def check_screen(app) -> None:
    draft = app.draft
    assert app.screen.has_class("-narrow") == (app.size.width < NARROW_BELOW), (app.size, app.screen.classes)
    for field in app.screen.query(InputField):
        if shown(field):
            assert field.box.value == draft.shown(field.field), (field.field, field.box.value)
    for field in app.screen.query(ChoiceField):
        if not shown(field):
            continue
        options = [(choice, button) for choice, button in zip(field.choices, field.query(RadioButton)) if button.display]
        pressed = [choice.label for choice, button in options if button.value]
        held = [choice.label for choice, _ in options if choice_held(draft, choice)]
        assert pressed == held[:1], (field.id, pressed, held)
        assert not any(button.value and button.disabled for _, button in options), field.id
    verdicts = list(app.screen.query("#verdict"))
    if verdicts and shown(verdicts[0]):
        text = str(verdicts[0].render())
        recipe = draft.plannable
        if recipe is None:
            assert text == app.plan_status, text
        else:
            from tuner.planner import plan

            expected = plan(recipe)
            device = expected.gpu
            assert f"verdict: {expected.verdict}" in text and f"peak {gib(device.total_gib)}" in text, text
            if device.headroom_gib is not None:
                assert f"headroom {gib(device.headroom_gib)}" in text, text


class Session:
    def __init__(self, pilot):
        self.pilot = pilot
        self.app = pilot.app

    async def visit(self, mode: str) -> None:
        self.app.switch_mode(mode)
        await settle(self.pilot)

    async def do_visit(self, mode: str) -> None:
        await self.visit(mode)

    async def do_open(self, name: str) -> None:
        self.app.load_draft(Draft(copy.deepcopy(RECIPES[name])))

    async def do_autofit(self, pick: int) -> None:
        await self.visit("method")
        screen = self.app.screen
        if screen.query_one("#autofit").disabled:
            return
        screen.query_one("#method-kind RadioSet").focus()
        await settle(self.pilot)
        await self.pilot.press("f")
        await settle(self.pilot)
        choosable = [index for index, proposal in enumerate(screen.alternatives) if proposal.advice.fits]
        check_screen(self.app)
        if choosable:
            listing = screen.query_one("#alternatives", OptionList)
            listing.highlighted = choosable[pick % len(choosable)]
            await settle(self.pilot)
            check_screen(self.app)
            await self.pilot.press("enter")

    async def do_keys(self, field_id: str, keys: list[str]) -> None:
        await self.visit("method")
        field = self.app.screen.query_one(f"#{field_id}", ChoiceField)
        if not shown(field):
            return
        field.radio_set.focus()
        await settle(self.pilot)
        await self.pilot.press(*keys)  # a burst: no pause between the keys

    async def do_resize(self, size: tuple[int, int]) -> None:
        await self.pilot.resize_terminal(*size)


async def drive(steps: list[tuple]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        session = Session(pilot)
        for kind, *args in [("open", "8b"), *steps, ("visit", "review")]:
            await getattr(session, f"do_{kind}")(*args)
            await settle(pilot)
            check_screen(app)


EXAMPLES = int(os.environ.get("TUNER_DISPLAY_EXAMPLES", "4"))  # each example drives a fresh wizard for seconds


@example(steps=[("keys", "model-dtype", ["right", "enter"])])  # bfloat16 over auto, which resolves to bfloat16
@example(steps=[("resize", (81, 25)), ("visit", "method"), ("resize", (100, 30)), ("autofit", 0),
                ("resize", (99, 30))])  # odd sizes, on both sides of the narrow layout's break
@example(steps=[("open", "grpo"), ("visit", "method"), ("keys", "grpo-rewards", ["left", "enter"])])  # item 2
@example(steps=[("resize", (80, 24)), ("autofit", 0), ("visit", "review"), ("open", "70b")])  # items 4, 5
@example(steps=[("open", "moe"), ("keys", "lora-targets", ["right", "enter"]), ("keys", "method-kind",
                                                                                 ["right", "enter"])])  # item 1
@settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(steps=st.lists(actions, min_size=1, max_size=5))
def test_every_box_choice_and_verdict_shows_the_draft_and_its_plan(steps):
    asyncio.run(drive(steps))


async def press_every_option() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await Session(pilot).visit("method")
        for field_id in CHOICES:
            for index in range(len(app.screen.query_one(f"#{field_id}", ChoiceField).choices)):
                app.load_draft(Draft(copy.deepcopy(RECIPES["8b"])))  # each option pressed on the recipe as opened
                await settle(pilot)
                field = app.screen.query_one(f"#{field_id}", ChoiceField)
                button = field.query_one(f"#{field.id}-{index}", RadioButton)
                if not (shown(field) and button.display) or button.disabled:
                    continue
                button.scroll_visible(animate=False)
                for _ in range(2):  # the second press: the option the draft now holds
                    await settle(pilot)
                    await pilot.click(button)
                    await settle(pilot)
                    check_screen(app)


def test_pressing_any_option_of_any_box_shows_what_the_draft_then_holds():
    """Every option of every choice box, each pressed twice on the recipe as opened: a choice the draft holds only
    by what other fields resolve it to (bfloat16 weights where the recipe writes ``auto``) is applied, not dropped
    as an echo while the box shows it pressed.  (GRPO's rewards and a MoE model's experts: the examples above.)"""
    asyncio.run(press_every_option())
