"""Issue 13's twelve reproductions, each driven by keys at 80x24 and at 120x40: the wizard edits exactly
what the user chose, Auto-fit changes only what it names, and every screen works on a small terminal."""
from __future__ import annotations

import json
import shutil

import pytest
from textual.widgets import Button, Input, OptionList, ProgressBar, RichLog, Select, Sparkline, Static

from tui_helpers import SIZES, demo_draft, in_tmp, make_app, pilot_test, settle, wait_until  # noqa: F401 (in_tmp: autouse)
from tuner.recipe.io import recipe_to_yaml
from tuner.rundir.events import parse_event
from tuner.tui.draft import Draft
from tuner.tui.run_watch import RunWatch
from tuner.tui.screens.confirm import ConfirmScreen
from tuner.tui.screens.help import HelpScreen
from tuner.tui.widgets.fields import ChoiceField, ToggleField
from tuner.tui.widgets.plan_bar import PlanPanel

pytestmark = pytest.mark.slow  # drives the wizard through Pilot at two sizes

EIGHT_A100 = {"gpus_per_machine": 8, "gpu": "A100-80GB", "host_ram_gb": 512}
EIGHT_B_ON_A_4090 = {"model": {"id": "meta-llama/Llama-3.1-8B"},
                     "hardware": {"gpus_per_machine": 1, "gpu": "RTX4090", "host_ram_gb": 256}}


async def type_into(pilot, box: Input, text: str) -> None:
    """Clear a box and type ``text`` key by key, as a user does."""
    box.focus()
    box.value = ""
    await settle(pilot)
    await pilot.press(*text)
    await settle(pilot)


def shown(app, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


def options(app, selector: str) -> list[str]:
    listing = app.screen.query_one(selector, OptionList)
    return [str(listing.get_option_at_index(index).prompt) for index in range(listing.option_count)]


def visible(app, widget, within: str | None = None) -> bool:
    """Whole on screen: not cut by the terminal's edge, nor scrolled out of its container ``within``."""
    region = widget.region
    frame = app.screen.query_one(within).region if within else app.screen.region
    return bool(region.area) and frame.contains_region(region) and app.screen.region.contains_region(region)


# 1 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_the_form_keeps_typed_values_and_marks_the_conflict(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await pilot.press("enter", "ctrl+n")  # New recipe, then Hardware
        gpus = app.screen.query_one("#hardware-gpus_per_machine-input", Input)
        await type_into(pilot, gpus, "8")
        await pilot.press("tab")
        select = app.screen.query_one("#hardware-gpu-select", Select)
        assert app.focused is select
        select.value = "A100-80GB"
        await settle(pilot)
        assert gpus.value == "8" and select.value == "A100-80GB"
        assert "8 processes need a way to share the work" in shown(app, "#errors")
        await pilot.press("ctrl+n")  # Method marks the field to change
        reason = app.screen.query_one("#distribution .field-reason", Static)
        assert reason.display and "8 processes need a way to share the work" in str(reason.render())
        await pilot.press("escape")
        await type_into(pilot, gpus, "1")
        app.screen.query_one("#hardware-gpu-select", Select).value = "RTX4090"
        await settle(pilot)
        assert gpus.value == "1" and app.draft.valid
        assert app.draft.data["hardware"] == {"gpus_per_machine": 1, "gpu": "RTX4090"}


# 2 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_autofit_follows_the_draft_and_never_touches_model_or_hardware(size):
    app = make_app(Draft({"model": {"id": "meta-llama/Llama-3.1-8B"}, "hardware": EIGHT_A100,
                          "memory": {"distributed": "ddp"}}))
    async with app.run_test(size=size) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        await pilot.press("f")
        await settle(pilot)
        assert all("of 79.2 GiB" in prompt for prompt in options(app, "#alternatives"))
        app.switch_mode("hardware")  # one RTX4090 instead
        await settle(pilot)
        await type_into(pilot, app.screen.query_one("#hardware-gpus_per_machine-input", Input), "1")
        app.screen.query_one("#hardware-gpu-select", Select).value = "RTX4090"
        await settle(pilot)
        app.switch_mode("method")
        await settle(pilot)
        listed = options(app, "#alternatives")
        assert listed and not any("79.2" in prompt for prompt in listed)  # recomputed, not stale
        alternatives = app.screen.query_one("#alternatives", OptionList)
        alternatives.focus()
        await wait_until(pilot, lambda: app.focused is alternatives)
        await pilot.press("enter")
        await settle(pilot)
        assert app.draft.data["hardware"] == {"gpus_per_machine": 1, "gpu": "RTX4090", "host_ram_gb": 512}
        assert app.draft.value("model.id") == "meta-llama/Llama-3.1-8B" and app.plan.fits

        app.draft.apply({"model.id": "meta-llama/Llama-3.1-405B"})  # another model: the list goes
        app.draft_changed()
        await settle(pilot)
        listing = app.screen.query_one("#alternatives", OptionList)
        assert not listing.display and listing.option_count == 0
        await pilot.press("f")  # nothing fits: listed, not choosable
        await settle(pilot)
        assert listing.option_count == 1 and listing.get_option_at_index(0).disabled
        assert str(listing.get_option_at_index(0).prompt).startswith("1. nothing fits")
        before = dict(app.draft.data)
        listing.focus()
        await pilot.press("enter")
        await settle(pilot)
        assert app.draft.data == before

        app.switch_mode("start")  # a new recipe: the old list is gone
        await settle(pilot)
        starts = app.screen.query_one("#actions", OptionList)
        starts.highlighted = starts.get_option_index("builtin:demo")
        await pilot.press("enter")
        app.switch_mode("method")
        await settle(pilot)
        assert not app.screen.query_one("#alternatives", OptionList).display
        assert app.screen.query_one("#alternatives", OptionList).option_count == 0


# 3 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_after_autofit_defaults_stay_implicit(size):
    app = make_app(Draft(EIGHT_B_ON_A_4090))
    async with app.run_test(size=size) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        await pilot.press("f")
        await settle(pilot)
        await pilot.press("enter")  # the cheapest plan that fits
        await settle(pilot)
        assert app.plan.fits and "output" not in app.draft.data and "num_processes" not in app.draft.data["hardware"]
        app.switch_mode("training")
        await settle(pilot)
        await type_into(pilot, app.screen.query_one("#name-input", Input), "mine")
        await pilot.press("tab")
        await settle(pilot)
        assert app.screen.query_one("#output-dir-input", Input).value == "runs/mine"
        app.switch_mode("hardware")
        await settle(pilot)
        await type_into(pilot, app.screen.query_one("#hardware-gpus_per_machine-input", Input), "2")
        await settle(pilot)
        assert app.draft.valid and app.draft.value("hardware.num_processes") == 2


# 4 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_the_verdict_names_what_is_short_and_the_advice_has_its_field(size):
    app = make_app(Draft({"model": {"id": "meta-llama/Llama-3.1-70B"}, "hardware": EIGHT_A100,
                          "memory": {"distributed": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu",
                                     "offload_params": "cpu"}}))
    async with app.run_test(size=size) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        verdict = shown(app, "#verdict").splitlines()[0]
        assert "host RAM is" in verdict and "short" in verdict  # not the GPUs, which have room
        assert "disk is short" in shown(app, "#verdict")  # 70B full checkpoints need terabytes
        await pilot.press("f")
        await settle(pilot)
        assert "method.allow_method_change" in options(app, "#alternatives")[0]
        toggle = app.screen.query_one("#method-allow_method_change", ToggleField).checkbox
        toggle.focus()
        await pilot.press("space")
        await settle(pilot)
        assert app.draft.value("method.allow_method_change") is True
        assert any("LoRA" in prompt for prompt in options(app, "#alternatives"))  # the advice, re-asked


# 5 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_refused_choices_look_refused_and_every_reason_can_be_read(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        distribution = app.screen.query_one("#distribution", ChoiceField)
        fsdp, ddp = distribution.button("FSDP"), distribution.button("DDP")
        assert fsdp.disabled and not ddp.disabled
        assert fsdp.rich_style.color != ddp.rich_style.color and fsdp.rich_style.strike
        offload = app.screen.query_one("#offload-optimizer", ChoiceField)
        offload.radio_set.focus()
        await wait_until(pilot, lambda: shown(app, "#why").startswith("cpu, nvme: "))
        why = shown(app, "#why")
        assert why.startswith("cpu, nvme: offload needs ZeRO or FSDP")  # one line for options refused alike
        for field in ("#attention", "#precision", "#optimizer", "#distribution"):
            chosen = app.screen.query_one(field, ChoiceField)
            chosen.radio_set.focus()
            box = app.screen.query_one("#why-box")
            await wait_until(pilot, lambda: all(reason in shown(app, "#why") for reason in chosen.reasons)
                             and box.virtual_size.height >= len(chosen.reasons))
            text = shown(app, "#why")
            assert all(reason in text for reason in chosen.reasons)
            assert box.virtual_size.height >= len(chosen.reasons)  # all there; the box scrolls past 3 lines


# 6 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_save_as_follows_the_recipe_and_the_question_is_whole(size, in_tmp):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        starts = app.screen.query_one("#actions", OptionList)
        starts.highlighted = starts.get_option_index("builtin:demo")
        await pilot.press("enter")
        app.switch_mode("review")
        await settle(pilot)
        assert app.screen.query_one("#save-path", Input).value == "demo.yaml"
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert (in_tmp / "demo.yaml").is_file()
        app.switch_mode("start")
        await settle(pilot)
        starts.highlighted = starts.get_option_index("new")
        await pilot.press("enter")
        app.switch_mode("review")
        await settle(pilot)
        box = app.screen.query_one("#save-path", Input)
        assert box.value == "run.yaml"
        (in_tmp / "run.yaml").write_text("# mine\n")
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        question = app.screen.query_one("#question")
        rendered = " ".join(line.text.strip() for line in question.render_lines(question.region.reset_offset))
        assert app.screen.question == " ".join(rendered.split())
        await pilot.press("n")


# 7 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_every_option_and_autofit_fit_the_terminal(size):
    app = make_app(Draft(EIGHT_B_ON_A_4090))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        actions = app.screen.query_one("#actions", OptionList)
        assert actions.virtual_size.height == actions.option_count  # one line per Start entry
        app.switch_mode("method")
        await settle(pilot)
        form = app.screen.query_one("#method-form")
        for field in app.screen.query(ChoiceField):
            if not field.display:
                continue
            for index, choice in enumerate(field.choices):
                button = field.query_one(f"#{field.id}-{index}")
                if not button.display:  # an option the model does not have (a dense model's experts)
                    continue
                assert button.size.width >= len(choice.label) + 4, (field.id, choice.label)
                assert form.region.x <= button.region.x and button.region.right <= form.region.right - 1
        await pilot.press("f")
        await settle(pilot)
        for selector in ("#alternatives", "#proposal"):
            widget = app.screen.query_one(selector)
            widget.scroll_visible(animate=False)
            await wait_until(pilot, lambda: visible(app, widget, "#plan-side"))
            assert visible(app, widget, "#plan-side"), selector
        app.switch_mode("run")
        await settle(pilot)
        await pilot.resize_terminal(size[0], size[1] - 4)  # a smaller window keeps a usable log
        await wait_until(pilot, lambda: app.screen.size == (size[0], size[1] - 4))
        await settle(pilot)
        assert app.screen.query_one("#log", RichLog).size.height >= 3


# 8 ------------------------------------------------------------------------------------------
TQDM_AND_DICTS = ["Loading weights:  50%|█████     | 19/38 [00:00<00:00, 12440.18it/s]",
                  "{'loss': '4.674', 'grad_norm': '6.891', 'learning_rate': '0', 'epoch': '0.1667'}",
                  "[tuner] data: 190 training and 10 held-out instruction samples"]


@SIZES
@pilot_test
async def test_the_run_screen_shows_events_not_noise(size, in_tmp):
    app = make_app(demo_draft())
    async with app.run_test(size=size) as pilot:
        app.switch_mode("run")
        await settle(pilot)
        assert not app.screen.query_one("#progress", ProgressBar).display  # nothing launched: nothing moves
        now = 1_000_000.0
        watch = RunWatch(run_dir=in_tmp / "runs" / "demo", live=True, status="running", since=0.0, clock=lambda: now)
        app.run_watch = watch
        watch.absorb([parse_event({"event": "started", "max_steps": 12, "time": now - 5}),
                      parse_event({"event": "step", "step": 1, "max_steps": 12, "loss": 4.6, "eta_s": 12.0,
                                   "time": now - 5})],
                     TQDM_AND_DICTS)
        app.screen.show_run()
        await wait_until(pilot, lambda: "ETA 7 s" in shown(app, "#run-status"))  # counted down from the event
        assert not app.screen.query_one("#loss", Sparkline).display  # one point is not a chart
        assert "first logged step" in shown(app, "#loss-line")

        def logged() -> list[str]:
            return [line.text for line in app.screen.query_one("#log", RichLog).lines]
        await wait_until(pilot, lambda: "step 1/12  loss 4.6000  eta 12s" in " ".join(logged()))
        logged = logged()
        assert not any("it/s" in line or "{'loss'" in line for line in logged)
        assert "data: 190 training and 10 held-out instruction samples" in " ".join(logged)
        assert "step 1/12  loss 4.6000  eta 12s" in " ".join(logged)
        watch.absorb([parse_event({"event": "step", "step": 2, "max_steps": 12, "loss": 4.2, "time": now})])
        app.screen.show_run()
        await wait_until(pilot, lambda: app.screen.query_one("#loss", Sparkline).display)
        assert app.screen.query_one("#progress", ProgressBar).display


# 9 ------------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_chat_with_a_finished_run_one_line_per_speaker(size, in_tmp, demo_model_path):
    run = in_tmp / "runs" / "demo"
    shutil.copytree(demo_model_path, run / "final")
    recipe = demo_draft({"output.dir": str(run), "inference.max_new_tokens": 6}).recipe
    (run / "recipe.lock.yaml").write_text(recipe_to_yaml(recipe))
    (run / "events.jsonl").write_text("".join(json.dumps(event) + "\n" for event in [
        {"event": "started", "max_steps": 2, "time": 1.0}, {"event": "step", "step": 2, "loss": 1.0, "time": 2.0},
        {"event": "finished", "step": 2, "final_dir": str(run / "final"), "time": 3.0}]))
    app = make_app()
    async with app.run_test(size=size) as pilot:
        runs = app.screen.query_one("#runs", OptionList)
        runs.focus()
        await pilot.press("enter")
        await settle(pilot)
        assert app.current_mode == "run"
        chat = app.screen.query_one("#chat", Button)
        assert chat.display and visible(app, chat)
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: app.current_mode == "chat" and app.screen.query("#chat-model")
                         and app.screen.query_one("#chat-model", Input).value)
        assert app.current_mode == "chat"
        assert app.screen.query_one("#chat-model", Input).value == "runs/demo"  # the recent run, prefilled
        await wait_until(pilot, lambda: app.screen.session is not None, timeout=120)
        assert app.screen.session.sampling.greedy  # the demo answers greedily
        assert "instruction 'reverse' with each message as its input" in shown(app, "#placement")
        await pilot.press(*"hello", "enter")
        await wait_until(pilot, lambda: len(app.screen.session.history) == 2, timeout=120)
        await wait_until(pilot, lambda: "model> " in shown(app, "#conversation"))
        lines = shown(app, "#conversation").splitlines()
        assert lines[0] == "you> hello" and lines[1].startswith("model> ")


# 10 -----------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_lists_take_tab_then_enter_and_search_by_size(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await pilot.press("enter")  # New recipe: the Model screen
        search = app.screen.query_one("#model-search", Input)
        await type_into(pilot, search, "3.1-8b")  # "8b" alone now finds Qwen3-8B too
        assert options(app, "#model-list") and all(
            prompt.startswith("meta-llama/Llama-3.1-8B") for prompt in options(app, "#model-list"))
        await pilot.press("enter")  # the one match is taken
        await settle(pilot)
        assert app.draft.value("model.id") == "meta-llama/Llama-3.1-8B"
        await type_into(pilot, search, "qwen")
        await pilot.press("tab")  # into the list, then enter: the highlighted entry
        assert app.focused is app.screen.query_one("#model-list", OptionList)
        await pilot.press("enter")
        await settle(pilot)
        assert app.draft.value("model.id") == "Qwen/Qwen2.5-0.5B"
        app.switch_mode("start")
        await settle(pilot)
        await pilot.press("enter")  # another new recipe: no filter carried over, its model listed
        await settle(pilot)
        assert search.value == "" and len(options(app, "#model-list")) > 20
        listing = app.screen.query_one("#model-list", OptionList)
        assert listing.get_option_at_index(listing.highlighted).id == app.draft.value("model.id") == "builtin:demo"


# 11 -----------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_the_preview_of_a_model_not_on_this_machine_fails_at_once(size):
    app = make_app(demo_draft({"model.id": "someorg/not-downloaded"}))
    async with app.run_test(size=size) as pilot:
        app.switch_mode("data")
        await settle(pilot)  # told from the local cache, never a minute of download retries
        preview = shown(app, "#preview").replace("\n", " ")
        assert "someorg/not-downloaded: not in the local cache" in preview and "hf download" in preview


# 12 -----------------------------------------------------------------------------------------
@SIZES
@pilot_test
async def test_the_plan_counts_gpus_once_fits_once_keeps_host_ram_and_opens_help(size):
    app = make_app(Draft({"hardware": {"gpus_per_machine": 8, "gpu": "A100-40GB"}, "memory": {"distributed": "ddp"}}))
    async with app.run_test(size=size) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        plan = shown(app, "#plan")
        assert "GPU (8 x A100-40GB), each:" in plan and "×8" not in plan  # the count once
        await pilot.press("f")
        await settle(pilot)
        assert len(options(app, "#alternatives")) == 1  # the demo fits as is: no four costlier copies
        app.switch_mode("hardware")
        await settle(pilot)
        ram = app.screen.query_one("#hardware-host_ram_gb-input", Input)
        await type_into(pilot, ram, "512")
        await pilot.press("tab")
        app.switch_mode("method")
        await settle(pilot)
        app.switch_mode("hardware")
        await settle(pilot)
        assert ram.value == "512" and app.draft.value("hardware.host_ram_gb") == 512.0
        await pilot.press("f1")  # (? would be typed into the focused box)
        assert isinstance(app.screen, HelpScreen)
        await wait_until(pilot, lambda: app.screen.query("Markdown"))
        assert "Chat" in app.screen.query_one("Markdown").source


@SIZES
@pilot_test
async def test_an_offload_bar_without_a_known_capacity_says_so(size):
    app = make_app(Draft({"model": {"id": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpus_per_machine": 1, "gpu": "RTX4090"},
                          "memory": {"distributed": "deepspeed", "zero_stage": 2, "offload_optimizer": "cpu",
                                     "gradient_checkpointing": True}}))
    async with app.run_test(size=size) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        plan = app.screen.query_one(PlanPanel)
        assert "of an unknown capacity" in shown(app, "#plan") and "set Host RAM" in shown(app, "#plan")
        assert plan.plan.devices[1].capacity_gib is None
