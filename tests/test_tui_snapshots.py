"""SVG snapshots of every screen at a fixed size, on fixed data (no hardware detection, no clock, steady cursor,
frozen plans: the planner's arithmetic has its own tests, these test what the wizard shows).

Update after an intended change with: python -m pytest tests/test_tui_snapshots.py --snapshot-update
(then copy them to the docs with: python tests/tui_helpers.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input

from tui_helpers import FIXED_PLANNER, SIZE, demo_draft, make_app as make_live_app, settle
from tuner.rundir.events import parse_event
from tuner.tui.draft import Draft
from tuner.tui.run_watch import RunWatch

pytestmark = pytest.mark.slow  # renders the wizard's screens

FIXED_RECIPES = Path(__file__).parent / "data" / "tui-recipes"
# host RAM is stated so the CPU plan does not depend on the machine the snapshot is taken on
SNAPSHOT_DRAFT = {"hardware.host_ram_gb": 16}
STEPS = ["start", "model", "hardware", "method", "data", "training", "review"]


@pytest.fixture(autouse=True)
def fixed_world(tmp_path, monkeypatch, demo_model_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNER_RECIPES_DIR", str(FIXED_RECIPES))
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


def make_app(draft):
    return make_live_app(draft, planner=FIXED_PLANNER)


def finished_run() -> RunWatch:
    """A run as its events describe it, without launching anything."""
    watch = RunWatch(run_dir=Path("runs/demo"), status="running")
    events = [{"event": "started", "max_steps": 12, "time": 1.0}]
    for step, loss in enumerate([4.6, 4.4, 4.1, 3.7, 3.2, 2.8, 2.3, 1.9, 1.6, 1.3, 1.1, 1.0], start=1):
        events.append({"event": "step", "step": step, "max_steps": 12, "loss": loss, "tokens_per_s": 2048.0,
                       "eta_s": 12.0 - step, "peak_rss_gib": 0.61, "time": 1.0 + step})
    events.append({"event": "finished", "step": 12, "final_dir": "runs/demo/final", "time": 14.0})
    watch.absorb([parse_event(event) for event in events], ["[tuner] data: 3800 training and 200 held-out instruction samples",
                          "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 138.07it/s]",
                          "{'loss': '4.6', 'grad_norm': '6.9', 'learning_rate': '0.003', 'epoch': '0.1'}"])
    watch.finish(0)
    return watch


@pytest.mark.parametrize("mode", STEPS)
def test_screen(mode, snap_compare):
    async def show(pilot):
        pilot.app.switch_mode(mode)
        await settle(pilot)
        if mode == "model":  # a search keeps the snapshot independent of catalog additions
            pilot.app.screen.query_one("#model-search", Input).value = "smollm2"
            await settle(pilot)

    assert snap_compare(make_app(demo_draft(SNAPSHOT_DRAFT)), terminal_size=SIZE, run_before=show)


def test_run_screen(snap_compare):
    app = make_app(demo_draft(SNAPSHOT_DRAFT))

    async def show(pilot):
        pilot.app.run_watch = finished_run()
        pilot.app.run_watch.plan = pilot.app.plan
        pilot.app.switch_mode("run")
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=show)


def test_chat_with_the_demo_model_loaded(snap_compare):
    """The demo recipe (its untrained model): asked as the recipe's data trains it, greedily, one line per speaker."""

    async def show(pilot):
        pilot.app.switch_mode("chat")
        await settle(pilot)
        pilot.app.screen.query_one("#chat-model", Input).value = "demo"
        await pilot.press("enter")
        await settle(pilot)
        await pilot.press(*"abc", "enter")
        await settle(pilot)

    assert snap_compare(make_app(demo_draft(SNAPSHOT_DRAFT)), terminal_size=SIZE, run_before=show)


def test_help(snap_compare):
    assert snap_compare(make_app(demo_draft(SNAPSHOT_DRAFT)), terminal_size=SIZE, press=["question_mark"])


def test_method_with_disabled_reasons_on_focus(snap_compare):
    async def show(pilot):
        pilot.app.switch_mode("method")
        await settle(pilot)
        pilot.app.screen.query_one("#distribution-set").focus()
        await settle(pilot)

    assert snap_compare(make_app(demo_draft(SNAPSHOT_DRAFT)), terminal_size=SIZE, run_before=show)


def test_docs_show_the_current_screens():
    """docs/tui.md's screenshots are the accepted snapshots (refresh: python tests/tui_helpers.py)."""
    from tui_helpers import DOCS_IMAGES, DOCS_SCREENSHOTS, SNAPSHOTS

    for snapshot, image in DOCS_SCREENSHOTS.items():
        assert (DOCS_IMAGES / image).read_bytes() == (SNAPSHOTS / snapshot).read_bytes(), image


def test_method_after_autofit_on_a_gpu(snap_compare):
    """An 8B model on one 24 GB card: the plans that fit, and the changes Enter would apply."""
    draft = Draft({"model": {"id": "meta-llama/Llama-3.1-8B"},
                   "hardware": {"gpus_per_machine": 1, "gpu": "RTX4090", "host_ram_gb": 256}})

    async def show(pilot):
        pilot.app.switch_mode("method")
        await settle(pilot)
        await pilot.press("f")
        await settle(pilot)

    assert snap_compare(make_app(draft), terminal_size=SIZE, run_before=show)


NARROW = (80, 24)


@pytest.mark.parametrize("mode", ["start", "method", "run"])
def test_screen_at_80x24(mode, snap_compare):
    """The smallest terminal the wizard supports: options wrap, panels scroll, nothing is cut."""
    draft = demo_draft(SNAPSHOT_DRAFT)

    async def show(pilot):
        if mode == "run":
            pilot.app.run_watch = finished_run()
        pilot.app.switch_mode(mode)
        await settle(pilot)

    assert snap_compare(make_app(draft), terminal_size=NARROW, run_before=show)
