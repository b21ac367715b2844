"""The wizard launches through the same run contract as ``tuner run``: the same refusal words, the same override
(as an explicit choice), the per-machine commands for a multi-machine recipe, the summary at the end, and no rank
that outlives the wizard."""
from __future__ import annotations

import signal

import pytest
from textual.widgets import Button, Static

from conftest import process_running
from tui_helpers import QUICK_RUN, SIZE, demo_draft, make_app, pilot_test, settle, wait_until

from tuner.rundir.events import read_records
from tuner.launch.run import RunRefused, prepare_run
from tuner.rundir.lock import lock_path


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def summary_text(app) -> str:
    return str(app.screen.query_one("#run-summary", Static).render())


@pytest.mark.slow
@pilot_test
async def test_a_refused_plan_shows_the_clis_words_and_launch_anyway_launches(in_tmp, demo_model_path):
    draft = demo_draft({**QUICK_RUN, "hardware.host_ram_gb": 0.1, "output.dir": str(in_tmp / "runs" / "small")})
    with pytest.raises(RunRefused) as cli:  # what `tuner run` says for the same recipe
        prepare_run(draft.recipe)
    app = make_app(draft)
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("run")
        await settle(pilot)
        override = app.screen.query_one("#override", Button)
        assert not override.display, "no override is offered before a refusal"
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.run_watch is not None and app.run_watch.status == "not started")
        await settle(pilot)
        assert summary_text(app) == "\n".join(cli.value.lines)
        assert override.display and not (in_tmp / "runs" / "small").exists()

        await pilot.click("#override")
        await wait_until(pilot, lambda: app.run_watch.exit_code is not None and app.run_watch.status != "not started",
                         timeout=150)
        await settle(pilot)
        assert app.run_watch.status == "finished", list(app.run_watch.log)[-20:]
        assert any(line.startswith("launching anyway: predicted not to fit") for line in app.run_watch.log)
        shown = summary_text(app)
        assert shown.startswith("finished in ") and f"model saved in {in_tmp / 'runs' / 'small' / 'final'}" in shown
        assert "next:" in shown and "tuner chat" in shown
        assert not override.display


@pilot_test
async def test_a_two_machine_recipe_shows_the_per_machine_commands_and_launches_nothing(in_tmp):
    draft = demo_draft({"hardware.machines": 2, "hardware.gpus_per_machine": 1, "hardware.gpu": "A100-80GB",
                        "hardware.main_process_ip": "10.0.0.1", "memory.distributed": "ddp",
                        "output.dir": str(in_tmp / "runs" / "two")})
    app = make_app(draft)
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("run")
        await settle(pilot)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.run_watch is not None and app.run_watch.status == "not started")
        await settle(pilot)
        shown = summary_text(app)
        assert "a run on 2 machines starts on each of them" in shown
        assert "machine 1: accelerate launch" in shown and "--machine_rank 1" in shown
        assert not app.screen.query_one("#override", Button).display
        assert not (in_tmp / "runs" / "two" / "events.jsonl").exists()
        assert not lock_path(in_tmp / "runs" / "two").exists()


@pytest.mark.slow
@pilot_test
async def test_sigterm_to_the_wizard_stops_every_rank_before_it_exits(in_tmp, demo_model_path, monkeypatch):
    monkeypatch.setenv("TUNER_TRACE_RANKS", "1")
    run_dir = in_tmp / "runs" / "long"
    draft = demo_draft({**QUICK_RUN, "training.max_steps": 100000, "data.max_samples": None,
                        "output.dir": str(run_dir)})
    app = make_app(draft)
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("run")
        await settle(pilot)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.run_watch.step >= 1, timeout=150)
        pids = {e["pid"] for e in read_records(run_dir / "events.jsonl") if e["event"] == "rank_batch"}
        assert pids
        app.handle_stop_signal(signal.SIGTERM)  # what the loop's SIGTERM handler calls
        await wait_until(pilot, lambda: not app.is_running, timeout=60)
    assert app.return_code == 128 + signal.SIGTERM
    assert not [pid for pid in pids if process_running(pid)], "a rank outlived the wizard"
    assert not lock_path(run_dir).exists()
