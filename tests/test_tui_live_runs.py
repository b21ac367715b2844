"""Issue 49, the wizard's runs and keys: a live run is "running" at its step wherever it is shown (its lock and events,
as ``tuner run`` leaves them), the Run log ends at the end, Ctrl-C offers to stop the run, the Model step takes
typing at once, no keystroke is lost in a burst."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from textual import events
from textual.widgets import Input, OptionList, RichLog, Static

from tui_helpers import SIZES, demo_draft, in_tmp, make_app, pilot_test, settle, wait_until  # noqa: F401 (in_tmp: autouse)
from tuner.recipe.io import recipe_to_yaml
from tuner.rundir.events import write_event, Error, Finished, Started, Step
from tuner.rundir.layout import EVENTS_FILE, LOCK_FILE
from tuner.rundir.lock import RunLock, lock_path
from tuner.tui.run_watch import LOG_LINES, STOPPING, RunWatch, replay
from tuner.tui.screens.confirm import ConfirmScreen

def run_directory(root: Path, name: str = "demo") -> Path:
    run_dir = root / "runs" / name
    run_dir.mkdir(parents=True)
    (run_dir / LOCK_FILE).write_text(recipe_to_yaml(demo_draft({"output.dir": str(run_dir)}).recipe))
    return run_dir


def steps(run_dir: Path, first: int, last: int, max_steps: int = 595, time: float = 100.0) -> None:
    for step in range(first, last + 1, 25):
        write_event(run_dir / EVENTS_FILE, Step.of({"step": step, "max_steps": max_steps, "loss": 1.0 + 1 / step},
                                                    time=time + step))


def dead_pid() -> int:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(finished.stdout)


# 3: one source of truth for a run's state -----------------------------------------------------
SEGMENT = st.tuples(st.integers(1, 40), st.sampled_from(["finished", "error", "stopped"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(earlier=st.lists(SEGMENT, max_size=3), last=st.integers(0, 40), lock=st.sampled_from(["live", "dead", "none"]))
def test_a_run_is_running_exactly_while_a_live_process_holds_its_lock(tmp_path_factory, earlier, last, lock):
    """Whatever earlier segments of the run directory ended in (a finish, an error, a stop), the last one's state is
    its lock's: held by a live process, running at the last step its events reached; else stopped there."""
    run_dir = tmp_path_factory.mktemp("run") / "demo"
    run_dir.mkdir()
    clock = 1000.0
    for count, end in [*earlier, (last, "going")]:
        clock += 100
        write_event(run_dir / EVENTS_FILE, Started.of({"max_steps": 50}, time=clock))
        for step in range(1, count + 1):
            write_event(run_dir / EVENTS_FILE, Step.of({"step": step, "max_steps": 50, "loss": 2.0}, time=clock + step))
        if end == "finished":
            write_event(run_dir / EVENTS_FILE, Finished.of({"step": count, "final_dir": "final"}, time=clock + 60))
        elif end == "error":
            write_event(run_dir / EVENTS_FILE, Error.of({"message": "out of memory"}, time=clock + 60))
    holder = RunLock(run_dir)
    if lock == "live":
        holder.acquire()
    elif lock == "dead":
        lock_path(run_dir).write_text(json.dumps({"pid": dead_pid(), "host": __import__("socket").gethostname()}))
    try:
        watch = replay(run_dir)
    finally:
        holder.release()
        lock_path(run_dir).unlink(missing_ok=True)
    assert watch.step == last
    if lock == "live":
        assert watch.status == "running"
    else:
        assert watch.status == f"stopped at step {last}"


@SIZES
@pilot_test
async def test_recent_runs_shows_a_training_run_as_running_at_its_current_step(size, in_tmp):
    run_dir = run_directory(in_tmp)
    write_event(run_dir / EVENTS_FILE, Started.of({"max_steps": 595}, time=100.0))
    steps(run_dir, 25, 225)
    lock = RunLock(run_dir).acquire()  # a tuner run training it, alive
    try:
        app = make_app()
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            runs = app.screen.query_one("#runs", OptionList)

            def line() -> str:
                return str(runs.get_option_at_index(0).prompt)
            assert line().startswith("demo  running  step 225/595"), line()
            steps(run_dir, 250, 375)
            await wait_until(pilot, lambda: "step 375/595" in line())
            assert "running" in line() and "stopped" not in line()
            runs.focus()
            await pilot.press("enter")  # the Run screen says the same, and follows it
            await settle(pilot)
            assert app.current_mode == "run"
            status = app.screen.query_one("#run-status", Static)
            assert str(status.render()).startswith("running  ·  step 375/595")
            steps(run_dir, 400, 450)
            await wait_until(pilot, lambda: "step 450/595" in str(status.render()))
            lock.release()  # the run's process is gone without a finish: stopped where it was
            await wait_until(pilot, lambda: str(status.render()).startswith("stopped at step 450"))
    finally:
        lock.release()


# 7: the Run log follows the end ----------------------------------------------------------------
@given(batches=st.lists(st.integers(0, 3 * LOG_LINES), min_size=1, max_size=6))
def test_log_since_hands_a_reader_every_line_it_has_not_seen(batches):
    """However many lines arrive between two looks (more than the log keeps too), the reader ends with the log's
    last line, and never sees a line twice."""
    watch = RunWatch(run_dir=Path("runs/demo"))
    seen, shown = 0, []
    for count in batches:
        watch.absorb([], [f"line {watch.logged + index}" for index in range(count)])
        new, restart = watch.log_since(seen)
        shown = [*([] if restart else shown), *new][-LOG_LINES:]
        seen = watch.logged
        assert shown == list(watch.log)


@SIZES
@pilot_test
async def test_the_run_log_ends_at_the_run_s_last_line(size, in_tmp):
    app = make_app(demo_draft())
    async with app.run_test(size=size) as pilot:
        watch = RunWatch(run_dir=in_tmp / "runs" / "demo", live=True, status="running", since=0.0)
        app.run_watch = watch
        app.switch_mode("run")
        await settle(pilot)
        for first in range(1, 596, 35):  # far more lines than the log keeps, arriving in batches
            watch.absorb([Step.of({"step": step, "max_steps": 595, "loss": 1.0}, time=1.0)
                          for step in range(first, min(first + 35, 596))])
            app.screen.show_run()
            await pilot.pause()
        watch.finish(0, ["finished in 61 s: 595 steps"])
        app.screen.show_run()
        await settle(pilot)
        log = app.screen.query_one("#log", RichLog)
        assert log.lines[-1].text.startswith("step 595/595")
        assert log.scroll_y == log.max_scroll_y  # showing the end


# 8: Ctrl-C during a run offers to stop it --------------------------------------------------------
@SIZES
@pilot_test
async def test_ctrl_c_during_a_run_asks_to_stop_it_as_ctrl_x_does(size, in_tmp):
    app = make_app(demo_draft())
    async with app.run_test(size=size) as pilot:
        await pilot.press("ctrl+c")  # no run: Textual's hint, nothing else
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmScreen)
        app.run_watch = RunWatch(run_dir=in_tmp / "runs" / "demo", live=True, status="running", since=0.0)
        app.switch_mode("model")
        await settle(pilot)
        await pilot.press("ctrl+c")  # in the search box, nothing selected: not a copy
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        question = str(app.screen.query_one("#question").render())
        assert "Stop every rank?" in question and "Ctrl-X" in question
        await pilot.press("n")
        await settle(pilot)
        assert app.run_watch.running and not app.run_watch.cancelled
        await pilot.press("ctrl+c", "y")
        await settle(pilot)
        assert app.run_watch.cancelled and app.run_watch.status == STOPPING
        assert app._stop_run.is_set()  # what Ctrl-X on the Run screen sets: the follower stops every rank
        app.switch_mode("run")
        await settle(pilot)
        assert str(app.screen.query_one("#run-status", Static).render()).startswith(STOPPING)


# 6: the Model step takes typing at once -------------------------------------------------------
@SIZES
@pilot_test
async def test_the_model_step_arrives_with_focus_in_the_search(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await pilot.press("enter")  # New recipe
        await settle(pilot)
        search = app.screen.query_one("#model-search", Input)
        assert app.focused is search
        await pilot.press(*"qwen3")
        await settle(pilot)
        listing = app.screen.query_one("#model-list", OptionList)
        ids = [listing.get_option_at_index(index).id for index in range(listing.option_count)]
        assert search.value == "qwen3" and ids and all("qwen3" in entry.lower() for entry in ids)


# 10: no keystroke is lost in a burst ------------------------------------------------------------
def burst(app, *keys: str) -> None:
    """Keys as a terminal delivers a fast typist's or tmux's burst: all read before the first is handled."""
    for key in keys:
        app.post_message(events.Key(key, key if len(key) == 1 else {"tab": "\t", "enter": "\r"}.get(key)))


BOXES = ["#training-micro_batch_size-input", "#training-gradient_accumulation_steps-input",
         "#training-max_seq_length-input"]  # in focus order


@settings(max_examples=3, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(bursts=st.lists(st.tuples(st.integers(0, len(BOXES) - 1), st.text("123456789", min_size=1, max_size=4)),
                       min_size=4, max_size=8))
@pilot_test
async def test_a_burst_of_tabs_and_digits_lands_where_the_tabs_lead(bursts):
    app = make_app(demo_draft())
    app.keys_in_order = True  # as in a terminal (Pilot's press waits for each key itself)
    async with app.run_test(size=(120, 40)) as pilot:
        app.switch_mode("method")
        await settle(pilot)
        for tabs, digits in bursts:
            boxes = [app.screen.query_one(selector, Input) for selector in BOXES]
            before = [box.value for box in boxes]
            app.set_focus(None)
            await settle(pilot)
            boxes[0].focus()  # arriving in a box selects its text: what is typed replaces it
            await settle(pilot)
            burst(app, *["tab"] * tabs, *digits)
            await settle(pilot)
            expected = [digits if index == tabs else value for index, value in enumerate(before)]
            assert [box.value for box in boxes] == expected
            field = boxes[tabs].parent.parent.field
            assert app.draft.shown(field) == digits


@SIZES
@pilot_test
async def test_typing_right_after_enter_on_new_recipe_reaches_the_model_search(size):
    app = make_app()
    app.keys_in_order = True
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        burst(app, "enter", *"qwen3")  # before the Model step has even been built
        await settle(pilot)
        assert app.current_mode == "model"
        assert app.screen.query_one("#model-search", Input).value == "qwen3"
        burst(app, "ctrl+n", "ctrl+n", "tab", *"1589")  # two steps on, one box down: LoRA rank
        await settle(pilot)
        assert app.current_mode == "method"
        assert app.focused.id == "method-lora-r-input", app.focused
        assert app.focused.value == app.draft.shown("method.lora.r") == "1589"
