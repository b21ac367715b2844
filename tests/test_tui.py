"""Pilot tests: the wizard driven by keys as a person would, asserting on its draft, messages and screens."""
from __future__ import annotations

import pytest
from textual.widgets import Input, OptionList, ProgressBar, Sparkline, Static

from conftest import run_tuner
from tui_helpers import (QUICK_RUN, SIZE, demo_draft, in_tmp, make_app, pilot_test, read_files,  # noqa: F401 (in_tmp: autouse)
                         settle, wait_until)
from tuner.recipe.io import load_recipe
from tuner.rundir.layout import MANIFEST
from tuner.tui.draft import Draft
from tuner.tui.messages import PlanUpdated
from tuner.tui.screens.confirm import ConfirmScreen
from tuner.tui.screens.data import LEARNED_STYLE, MASKED_STYLE
from tuner.tui.screens.help import HelpScreen
from tuner.tui.widgets.fields import ChoiceField, ToggleField
from tuner.tui.widgets.plan_bar import PlanPanel

pytestmark = pytest.mark.slow  # drives the wizard through Pilot


@pilot_test
async def test_wizard_end_to_end_saves_what_review_showed(in_tmp, demo_model_path):
    app = make_app()
    messages = []
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await pilot.press("enter")  # Start: "New recipe"
        assert app.current_mode == "model"
        await pilot.press("enter")  # the first catalog entry: the demo model
        assert app.draft.value("model.id") == "builtin:demo"

        await pilot.press("ctrl+n")  # Hardware: nothing detected, the CPU topology by default
        assert app.current_mode == "hardware"
        assert app.draft.value("hardware.gpus_per_machine") == 0

        await pilot.press("ctrl+n")  # Method: LoRA
        assert app.current_mode == "method"
        assert app.focused is app.screen.query_one("#method-kind", ChoiceField).radio_set
        await pilot.press("right", "enter")  # Full -> LoRA
        await wait_until(pilot, lambda: app.draft.value("method.kind") == "lora")
        await pilot.press("f")  # Auto-fit: the demo fits as it is, so the first entry changes nothing
        await wait_until(pilot, lambda: app.focused is app.screen.query_one("#alternatives", OptionList)
                         and "as it is now" in str(app.screen.query_one("#proposal", Static).render()))
        before = dict(app.draft.data)
        await pilot.press("enter")
        await settle(pilot)
        assert app.draft.data == before and str(app.plan.verdict) != "does not fit"
        assert any(isinstance(message, PlanUpdated) for message in messages)

        for _ in range(3):  # Data, Training, Review
            await pilot.press("ctrl+n")
        assert app.current_mode == "review"
        await wait_until(pilot, lambda: set(app.screen.files) == {"recipe.lock.yaml", "accelerate.yaml", "launch.sh"})
        shown = dict(app.screen.files)
        box = app.screen.query_one("#save-path", Input)
        box.value = "saved.yaml"
        await pilot.press("ctrl+s")
        saved = in_tmp / "saved.yaml"
        await wait_until(pilot, saved.exists)

    assert load_recipe(saved).method.kind == "lora"
    result = run_tuner("render", str(saved), cwd=in_tmp)
    assert result.returncode == 0, result.stderr
    rendered = read_files(in_tmp / load_recipe(saved).output.dir)
    assert MANIFEST in rendered  # the record of what tuner wrote, beside the files Review showed
    assert {name: text for name, text in rendered.items() if name != MANIFEST} == shown


@pilot_test
async def test_incompatible_choices_are_disabled_with_the_reason():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("method")
        await wait_until(pilot, lambda: app.screen.query("#distribution ChoiceField, #distribution RadioButton")
                         and app.screen.query_one("#distribution", ChoiceField).button("FSDP").disabled
                         and app.screen.query_one("#attention", ChoiceField).button("flash").disabled
                         and app.screen.query_one("#offload-optimizer", ChoiceField).button("cpu").disabled)
        distribution = app.screen.query_one("#distribution", ChoiceField)
        fsdp = distribution.button("FSDP")
        assert fsdp.disabled and "FSDP needs GPUs" in str(fsdp.tooltip)
        flash = app.screen.query_one("#attention", ChoiceField).button("flash")
        assert flash.disabled and "flash attention needs a CUDA GPU" in str(flash.tooltip)
        offload = app.screen.query_one("#offload-optimizer", ChoiceField)
        assert offload.button("cpu").disabled
        assert "offload needs ZeRO or FSDP" in str(offload.button("cpu").tooltip)

        why = app.screen.query_one("#why", Static)
        distribution.radio_set.focus()  # the focused field's reasons show below the form, for keyboard users
        await wait_until(pilot, lambda: "FSDP: FSDP needs GPUs" in str(why.render()))
        app.screen.query_one("#training-micro_batch_size-input", Input).focus()
        await wait_until(pilot, lambda: str(why.render()) == "")
        distribution.radio_set.focus()
        await wait_until(pilot, lambda: app.focused is distribution.radio_set)

        # Single -> DDP -> ZeRO-0 -> ZeRO-1 -> ZeRO-2: offload allowed
        await pilot.press("right", "right", "right", "right", "enter")
        await wait_until(pilot, lambda: app.draft.value("memory.zero_stage") == 2
                         and not offload.button("cpu").disabled)
        assert app.draft.valid


@pilot_test
async def test_tensor_parallel_is_chosen_on_the_method_step_with_reasons_and_saved(in_tmp):
    """tp is refused with the checks' own reason until the recipe can run it; chosen, it is what the file says."""
    app = make_app(demo_draft({"hardware.num_processes": 2, "memory.distributed": "ddp",
                               "memory.mixed_precision": "no"}))
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        tp = app.screen.query_one("#parallelism-tp", ChoiceField)
        assert tp.button("2").disabled and "runs under distributed: deepspeed" in str(tp.button("2").tooltip)
        sp = app.screen.query_one("#parallelism-sp", ChoiceField)
        assert sp.button("2").disabled and "sequence parallelism is DeepSpeed Ulysses" in str(sp.button("2").tooltip)
        ep = app.screen.query_one("#parallelism-ep", ChoiceField)  # offered, with validate's reason where refused
        assert ep.button("2").disabled and "expert parallelism is transformers' DistributedConfig" in str(
            ep.button("2").tooltip)

        app.screen.query_one("#distribution", ChoiceField).button("ZeRO-1").value = True
        await wait_until(pilot, lambda: not tp.button("2").disabled
                         and "must divide the 2 processes" in str(tp.button("4").tooltip))
        assert not tp.button("2").disabled
        assert tp.button("4").disabled and "must divide the 2 processes" in str(tp.button("4").tooltip)
        tp.button("2").value = True
        await wait_until(pilot, lambda: app.draft.value("parallelism.tp") == 2 and app.draft.valid
                         and app.screen.query_one("#distribution", ChoiceField).button("ZeRO-3").disabled)
        assert app.draft.value("parallelism.tp") == 2 and app.draft.valid
        assert app.screen.query_one("#distribution", ChoiceField).button("ZeRO-3").disabled  # AutoTP: ZeRO 0-2
        saved = app.draft.save(in_tmp / "tp.yaml")
    recipe = load_recipe(saved)
    assert (recipe.parallelism.tp, recipe.memory.zero_stage, recipe.data_parallel) == (2, 1, 1)


@pilot_test
async def test_invalid_input_is_kept_as_typed_marked_and_left_out_of_the_recipe():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("method")
        await wait_until(pilot, lambda: app.screen.query("#training-micro_batch_size-input"))
        box = app.screen.query_one("#training-micro_batch_size-input", Input)
        box.focus()
        await pilot.press("home", "ctrl+k", "0")
        errors = app.screen.query_one("#errors", Static)
        await wait_until(pilot, lambda: errors.display)
        assert "training.micro_batch_size" in str(errors.render())
        assert box.value == "0" and box.has_class("-invalid")
        reason = app.screen.query_one("#training-micro_batch_size .field-reason", Static)
        assert reason.display and "greater than or equal to 1" in str(reason.render())
        assert app.draft.recipe is None  # nothing to save or launch
        assert app.draft.data == {}  # the refused value is in no part of the recipe
        await wait_until(pilot, lambda: app.plan is None)  # and no plan of a recipe the user did not ask for
        await pilot.press("backspace", "4")
        await wait_until(pilot, lambda: app.draft.valid and not errors.display)
        assert app.draft.value("training.micro_batch_size") == 4 and app.plan is not None
        assert not errors.display and not reason.display and not box.has_class("-invalid")


@pilot_test
async def test_plan_bar_changes_when_checkpointing_is_toggled():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        panel = app.screen.query_one(PlanPanel)
        before = panel.plan.devices[0].terms["activations"]
        bar_before = str(panel.render())
        app.screen.query_one("#memory-gradient_checkpointing", ToggleField).checkbox.focus()
        await pilot.press("space")
        await wait_until(pilot, lambda: panel.plan.devices[0].terms["activations"] < before
                         and str(panel.render()) != bar_before)
        assert app.draft.value("memory.gradient_checkpointing") is True
        assert panel.plan.devices[0].terms["activations"] < before
        assert str(panel.render()) != bar_before


@pilot_test
async def test_autofit_lists_plans_that_fit_and_applies_only_the_chosen_changes():
    draft = Draft({"model": {"id": "meta-llama/Llama-3.1-8B"},
                   "hardware": {"gpus_per_machine": 1, "gpu": "RTX4090", "host_ram_gb": 256}})
    app = make_app(draft)
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        assert app.plan.verdict == "does not fit"
        assert "does not fit: GPU memory is" in str(app.screen.query_one("#verdict").render())
        await pilot.press("f")
        await settle(pilot)
        assert app.plan.verdict == "does not fit"  # listed, not applied
        alternatives = app.screen.query_one("#alternatives", OptionList)
        assert alternatives.display and alternatives.option_count >= 2
        assert "GiB of 24.0 GiB" in str(alternatives.get_option_at_index(0).prompt)
        alternatives.highlighted = 1
        await wait_until(pilot, lambda: all(field in str(app.screen.query_one("#proposal", Static).render())
                                            for field in app.screen.alternatives[1].changes))
        chosen = app.screen.alternatives[1]
        shown = str(app.screen.query_one("#proposal", Static).render())
        assert all(field in shown for field in chosen.changes)
        await pilot.press("enter")  # take the second plan
        await wait_until(pilot, lambda: all(app.draft.value(field) == value for field, value in chosen.changes.items())
                         and app.plan is not None and app.plan.fits)
        assert all(app.draft.value(field) == value for field, value in chosen.changes.items())
        assert app.draft.data["hardware"] == draft_hardware(app) == {"gpus_per_machine": 1, "gpu": "RTX4090",
                                                                     "host_ram_gb": 256}
        assert app.plan.fits


def draft_hardware(app) -> dict:
    return app.draft.data["hardware"]


@pilot_test
async def test_data_preview_shades_the_prompt(demo_model_path):
    app = make_app(demo_draft())
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("data")
        await settle(pilot)
        preview = app.screen.preview
        prompt, completion = preview.plain.split("=")
        assert prompt.startswith("reverse\n") and completion.endswith("</s>")
        assert [(preview.plain[span.start:span.end], span.style) for span in preview.spans] == [
            (prompt + "=", MASKED_STYLE), (completion, LEARNED_STYLE)]
        assert completion.removesuffix("</s>") == prompt.removeprefix("reverse\n")[::-1]


@pilot_test
async def test_saving_over_a_file_asks_first(in_tmp):
    target = in_tmp / "mine.yaml"
    target.write_text("# my notes\n")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("review")
        await settle(pilot)
        app.screen.query_one("#save-path", Input).value = str(target)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert target.read_text() == "# my notes\n"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_until(pilot, lambda: target.read_text() != "# my notes\n")
    assert load_recipe(target).name == "run"


@pilot_test
async def test_help_and_navigation_keys():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert app.current_mode == "start" and not isinstance(app.screen, HelpScreen)
        await pilot.press("ctrl+n")
        assert app.current_mode == "model"
        await pilot.press("ctrl+n", "ctrl+n")
        assert app.current_mode == "method"
        await pilot.press("escape")
        assert app.current_mode == "hardware"


@pilot_test
async def test_run_screen_launches_and_shows_progress_and_loss(in_tmp, demo_model_path):
    app = make_app(demo_draft({**QUICK_RUN, "output.dir": str(in_tmp / "runs" / "quick")}))
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("run")
        await settle(pilot)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.run_watch is not None and app.run_watch.exit_code is not None, timeout=150)
        watch = app.run_watch
        assert watch.status == "finished", list(watch.log)[-20:]
        assert watch.step == 6 and len(watch.losses) >= 5
        await wait_until(pilot, lambda: app.screen.query_one("#progress", ProgressBar).percentage == 1.0
                         and "finished" in str(app.screen.query_one("#run-status", Static).render()))
        assert app.screen.query_one("#progress", ProgressBar).percentage == 1.0
        assert list(app.screen.query_one("#loss", Sparkline).data) == watch.losses
        status = str(app.screen.query_one("#run-status", Static).render())
        assert "finished" in status and "loss" in status and "tokens/s" in status
        assert (in_tmp / "runs" / "quick" / "final").is_dir()
        shown = " ".join(watch.log)  # event lines and tuner's own, no progress frames or raw dicts
        assert "step 6/6  loss" in shown and "it/s" not in shown and "{'loss'" not in shown
        assert "gemm_4bit" not in (in_tmp / "runs" / "quick" / "train.log").read_text()  # no bitsandbytes here


@pilot_test
async def test_cancel_stops_the_run(in_tmp, demo_model_path):
    app = make_app(demo_draft({**QUICK_RUN, "training.max_steps": 100000, "data.max_samples": None}))
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("run")
        await settle(pilot)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.run_watch.step >= 1, timeout=150)
        step = app.run_watch.step
        app.switch_mode("review")  # leaving the screen does not stop the run
        await wait_until(pilot, lambda: app.run_watch.step > step, timeout=150)
        assert app.run_watch.running
        app.switch_mode("run")
        await wait_until(pilot, lambda: app.current_mode == "run")
        await pilot.press("ctrl+q")  # quitting asks first while a run is going
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert app.is_running and app.run_watch.running
        await pilot.press("ctrl+x")
        await wait_until(pilot, lambda: app.run_watch.exit_code is not None, timeout=60)
        assert app.run_watch.status == "cancelled"
        assert app.run_watch.step < 100000


@pilot_test
async def test_chat_streams_an_answer_from_the_demo_model(in_tmp, demo_model_path):
    demo_draft({"inference.max_new_tokens": 8}).save(in_tmp / "short.yaml")  # a recipe: model and a short answer
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("chat")
        await settle(pilot)
        box = app.screen.query_one("#chat-model", Input)
        box.focus()
        box.value = "short.yaml"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.screen.session is not None, timeout=120)
        assert "CPU" in str(app.screen.query_one("#placement", Static).render())
        assert "instruction 'reverse' with each message as its input" in str(
            app.screen.query_one("#placement", Static).render())
        app.screen.query_one("#chat-message", Input).value = "abc"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app.screen.session.history) == 2, timeout=120)
        await wait_until(pilot, lambda: "model> " in str(app.screen.query_one("#conversation", Static).render()))
        assert app.screen.session.history[0] == {"role": "user", "content": "reverse\nabc"}  # as the demo trained
        answer = app.screen.session.history[1]["content"]
        lines = str(app.screen.query_one("#conversation", Static).render()).splitlines()
        assert lines[:2] == ["you> abc", f"model> {answer}".rstrip()]  # one line per speaker


@pilot_test
async def test_start_opens_a_recipe_file_and_reports_a_bad_one(in_tmp):
    (in_tmp / "bad.yaml").write_text("name: x\ntraining:\n  micro_batch_size: [\n")
    demo_draft({"name": "mine"}).save(in_tmp / "mine.yaml")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "enter")  # "Open a recipe file…"
        box = app.screen.query_one("#open-path", Input)
        assert box.display and app.focused is box
        box.value = "bad.yaml"
        await pilot.press("enter")
        await wait_until(pilot, lambda: "bad.yaml:4" in str(app.screen.query_one("#start-error", Static).render()))
        assert app.current_mode == "start"
        assert "bad.yaml:4: not valid YAML" in str(app.screen.query_one("#start-error", Static).render())
        box.value = "mine.yaml"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.current_mode == "model")
        await settle(pilot)
        assert app.current_mode == "model" and app.draft.value("name") == "mine"
        assert app.draft.path.name == "mine.yaml"


@pilot_test
async def test_a_recent_run_opens_on_the_run_screen(in_tmp):
    import json

    from tuner.recipe.io import recipe_to_yaml

    run = in_tmp / "runs" / "earlier"
    run.mkdir(parents=True)
    (run / "recipe.lock.yaml").write_text(recipe_to_yaml(demo_draft({"name": "earlier"}).recipe))
    (run / "events.jsonl").write_text("".join(json.dumps(event) + "\n" for event in [
        {"event": "started", "max_steps": 4, "time": 1.0},
        {"event": "step", "step": 2, "max_steps": 4, "loss": 1.25, "time": 2.0},
    ]))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        runs = app.screen.query_one("#runs", OptionList)
        assert "stopped at step 2" in str(runs.get_option_at_index(0).prompt)
        runs.focus()
        runs.highlighted = 0
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.current_mode == "run")
        await settle(pilot)
        assert app.current_mode == "run" and app.draft.value("name") == "earlier"
        status = str(app.screen.query_one("#run-status", Static).render())
        assert "stopped at step 2" in status and "loss 1.2500" in status


@pilot_test
async def test_a_model_the_planner_does_not_know_is_explained_not_fatal():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("model")
        await settle(pilot)
        box = app.screen.query_one("#model-id-input", Input)
        box.focus()
        box.value = "someorg/not-a-known-model"
        await pilot.press("enter")
        await settle(pilot)
        assert app.draft.value("model.id") == "someorg/not-a-known-model"
        assert "no architecture facts" in str(app.screen.query_one("#facts", Static).render())
        app.switch_mode("method")
        await settle(pilot)
        assert app.plan is None
        assert "no architecture facts" in str(app.screen.query_one("#verdict").render())


@pilot_test
async def test_the_mouse_works_from_the_first_click():
    """Focus moving between fields must not shift the layout between mouse down and up."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        await pilot.click(app.screen.query_one("#memory-gradient_checkpointing", ToggleField).checkbox)
        await wait_until(pilot, lambda: app.draft.value("memory.gradient_checkpointing") is True)
        await pilot.click(app.screen.query_one("#distribution", ChoiceField).button("ZeRO-3"))
        await wait_until(pilot, lambda: app.draft.value("memory.zero_stage") == 3)
        fsdp = app.screen.query_one("#distribution", ChoiceField).button("FSDP")
        await pilot.click(fsdp)  # disabled: nothing happens
        await settle(pilot)
        assert app.draft.value("memory.distributed") == "deepspeed"


@pilot_test
async def test_the_objective_is_chosen_with_the_method_and_its_reference_shows_in_the_plan():
    app = make_app(demo_draft({"data.source": "builtin:reverse-pairs", "data.format": "preference"}))
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        objective = app.screen.query_one("#objective-kind", ChoiceField)
        assert not app.draft.valid  # sft does not read pairs; the conflict is said under the data format
        assert "objective sft reads text or instruction or chat or image_prompt_answer or image_chat data, not preference" in app.draft.reason("data.format")
        assert not objective.button("dpo").disabled
        assert not app.screen.query_one("#preference").display
        objective.radio_set.focus()
        await pilot.press("right", "enter")  # sft -> dpo
        await wait_until(pilot, lambda: app.draft.value("objective.kind") == "dpo" and app.plan is not None
                         and "reference_model" in app.plan.devices[0].terms)
        assert app.screen.query_one("#preference").display and app.draft.valid
        assert app.plan.devices[0].terms["reference_model"] > 0  # full fine-tuning keeps a frozen copy

        app.screen.query_one("#objective-precompute_ref_log_probs", ToggleField).checkbox.focus()
        await pilot.press("space")
        await wait_until(pilot, lambda: app.plan.devices[0].terms.get("reference_model", 0) == 0)
        assert app.draft.value("objective.precompute_ref_log_probs") is True
        assert any(device.kind == "pass" for device in app.plan.devices)  # the log-prob pass before training

        app.switch_mode("training")
        await settle(pilot)
        tracker = app.screen.query_one("#tracker", ChoiceField)
        tracker.radio_set.focus()
        await pilot.press("right", "enter")  # none -> tensorboard
        await wait_until(pilot, lambda: app.draft.value("training.report_to") == ["tensorboard"])
        assert app.draft.value("training.report_to") == ["tensorboard"]
        assert "objective:\n  kind: dpo" in app.draft.to_yaml() and "report_to:\n  - tensorboard" in app.draft.to_yaml()
