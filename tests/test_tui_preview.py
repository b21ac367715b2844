"""Issue 49 item 11: the Data step's example is made in a child process, as ``tuner data preview`` makes it, and the
wizard answers keys while it is being made; the child is bounded (killed when its answer is unwanted, or past
TUNER_PREVIEW_TIMEOUT)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from textual.widgets import Input, Static

from tui_helpers import SIZE, demo_draft, in_tmp, make_app, pilot_test, settle, wait_until  # noqa: F401 (in_tmp: autouse)
from tuner.data.preview import preview_examples
from tuner.loading.model import load_tokenizer
from tuner.tui.preview import TIMEOUT_VARIABLE
from tuner.tui.screens.data import preview_text

pytestmark = pytest.mark.slow  # drives the wizard through Pilot, with child processes that load transformers


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def shown(app, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


@pilot_test
async def test_the_example_comes_from_another_process_as_tuner_data_preview_makes_it(demo_model_path):
    app = make_app(demo_draft({"data.max_samples": 50}))
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("data")
        await settle(pilot)
        screen = app.screen
        recipe = app.draft.resolved
        data_format, examples = preview_examples(recipe, load_tokenizer(recipe), count=1)  # `tuner data preview`'s
        assert shown(app, "#preview-format") == f"format: {data_format}"
        assert screen.preview == preview_text(examples[0].segments)
        child = screen.previews.pid
        assert screen.preview_pid == child and child not in (None, os.getpid())  # it stays for the next question
        await pilot.press("ctrl+n")  # the step left: the child is killed
        await wait_until(pilot, lambda: app.current_mode == "training")
        assert screen.previews.pid is None and gone(child)


def model_with_a_hanging_tokenizer(folder, demo_model_path):
    """The demo model whose tokenizer ships code that never finishes importing: a preview that never comes."""
    shutil.copytree(demo_model_path, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_hang.HangTokenizer", "tokenization_hang.HangTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_hang.py").write_text("import time\n\ntime.sleep(3600)\n")
    return folder


@pilot_test
async def test_keys_are_answered_while_the_example_is_pending_and_its_process_is_bounded(in_tmp, demo_model_path,
                                                                                        monkeypatch):
    monkeypatch.setenv("HF_MODULES_CACHE", str(in_tmp / "modules"))  # where transformers copies the model's code
    model = model_with_a_hanging_tokenizer(in_tmp / "hanging", demo_model_path)
    app = make_app(demo_draft({"model.id": str(model), "model.trust_remote_code": True}))
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("data")
        await wait_until(pilot, lambda: app.current_mode == "data" and app.screen.previews.pid is not None)
        screen = app.screen
        first = screen.previews.pid
        box = next(field for field in screen.fields if getattr(field, "field", None) == "data.max_samples")
        box.query_one(Input).focus()
        await pilot.press("7")  # handled while the example is pending: a new question, the old child killed
        await wait_until(pilot, lambda: screen.previews.pid not in (None, first))
        assert app.draft.value("data.max_samples") == 7 and gone(first) and screen.preview_pending
        assert "loading an example" in shown(app, "#preview")
        second = screen.previews.pid
        await pilot.press("ctrl+n")  # the step left while pending
        await wait_until(pilot, lambda: app.current_mode == "training")
        assert screen.previews.pid is None and gone(second)
        monkeypatch.setenv(TIMEOUT_VARIABLE, "2")
        await pilot.press("escape")  # back: asked again, and stopped at the time limit
        await wait_until(pilot, lambda: "no example after 2 s" in shown(app, "#preview"), timeout=120)
        assert TIMEOUT_VARIABLE in shown(app, "#preview") and screen.previews.pid is None
        monkeypatch.delenv(TIMEOUT_VARIABLE)
        box.query_one(Input).focus()
        await pilot.press("1")  # asked again (71 samples), then the wizard closes while it is pending
        await wait_until(pilot, lambda: screen.previews.pid is not None)
        last = screen.previews.pid
    assert gone(last)
