"""The tuner wizard app: holds the draft recipe, the plan and the run; screens show and edit them.

``run_app()`` is what ``tuner`` (no subcommand) calls.  Heavy libraries (torch,
transformers, datasets) are imported only inside workers that need them.
"""
from __future__ import annotations

import asyncio
import importlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.binding import Binding

from tuner.tui.key_order import KeysInOrderApp
from tuner.tui.messages import (DiskChecked, FieldEdited, PlanUpdated, RunEventsArrived, RunFinished, RunNotStarted,
                                TextTyped)
from tuner.tui.planning import CannotPlan, Planner
from tuner.tui.run_watch import RunWatch
from tuner.tui.screens.start import StartScreen
from tuner.tui.widgets.steps import STEPS

if TYPE_CHECKING:
    from tuner.tui.draft import Draft

STEP_MODES = [mode for mode, _ in STEPS]
NARROW_BELOW = 100  # columns: screens get the -narrow class (80x24 terminals), see TunerApp.HORIZONTAL_BREAKPOINTS


def _later(module: str, name: str):
    """A screen imported when first shown, so the first screen paints before the others load."""
    def make():
        return getattr(importlib.import_module(f"tuner.tui.screens.{module}"), name)()

    return make


class TunerApp(KeysInOrderApp[int]):
    """The wizard.  Tests build it with a fixed draft and ``detect_hardware=False`` for stable screens; its keys
    are routed in order (:mod:`tuner.tui.key_order`)."""

    CSS_PATH = "app.tcss"
    TITLE = "tuner"
    SUB_TITLE = "plan, configure and launch a fine-tuning run"
    ENABLE_COMMAND_PALETTE = False
    MODES = {
        "start": StartScreen,
        "model": _later("model", "ModelScreen"),
        "hardware": _later("hardware", "HardwareScreen"),
        "method": _later("method", "MethodScreen"),
        "data": _later("data", "DataScreen"),
        "training": _later("training", "TrainingScreen"),
        "review": _later("review", "ReviewScreen"),
        "run": _later("run", "RunScreen"),
        "chat": _later("chat", "ChatScreen"),
    }
    DEFAULT_MODE = "start"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]  # a screen class for 80-column terminals
    BINDINGS = [
        Binding("ctrl+n", "next_step", "Next step", id="next_step", tooltip="Go to the next step of the wizard"),
        Binding("escape", "previous_step", "Back", id="previous_step", tooltip="Go to the previous step"),
        Binding("question_mark,f1", "help", "Help", id="help", key_display="?", tooltip="Keys and what each step does"),
        Binding("ctrl+q", "quit", "Quit", id="quit", tooltip="Quit (asks first while a run is going)"),
    ]

    def __init__(self, draft: Draft | None = None, planner: Planner | None = None, *, detect_hardware: bool = True,
                 capture_prints: bool = False):
        super().__init__()
        self.capture_prints = capture_prints  # print() under the app joins the libraries' output (run_app)
        self._draft = draft
        self.planner = planner or Planner()
        self.detect_hardware = detect_hardware
        self.plan = None
        self.plan_status = ""
        self.disk_check = None  # tuner.doctor.check_disk of the planned recipe, once a worker has it
        self.measured = None  # what a probe of the planned recipe measured on this machine (a MeasuredRecord)
        self.run_watch: RunWatch | None = None
        self.chat_target: str | None = None  # what "Chat with this run" asked Chat to load
        self._stop_run = threading.Event()  # set: the run's follower stops every rank

    @property
    def draft(self) -> Draft:
        """The recipe being edited (a new one is made at first use: the schema loads after the first paint)."""
        if self._draft is None:
            from tuner.tui.draft import Draft

            self._draft = Draft()
        return self._draft

    @draft.setter
    def draft(self, draft: Draft) -> None:
        self._draft = draft

    def on_mount(self) -> None:
        if self.capture_prints:
            self.begin_capture_print(self)
        self.call_after_refresh(self._after_first_paint)  # the first screen paints before the run contract loads

    def on_print(self, event) -> None:
        """What Textual's own stdout/stderr took (a print): into the log with the rest (descriptor 2 is its pipe)."""
        os.write(2, event.text.encode("utf-8", "replace"))

    def _after_first_paint(self) -> None:
        from tuner.launch.run import STOP_SIGNALS

        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:  # nothing runs before this: a signal until here ends the wizard as usual
            loop.add_signal_handler(signum, self.handle_stop_signal, signum)
        self.replan()
        self.warm_up()

    @work(thread=True, group="warm-up", exit_on_error=False)
    def warm_up(self) -> None:
        """While the Start screen is read: the recipe schema, the Model step and its catalog's facts, so New recipe
        opens the Model step without a pause (about a second of imports and arithmetic on a busy machine)."""
        from tuner.tui.catalog import catalog_entries
        from tuner.tui.draft import Draft  # noqa: F401  (the schema)

        importlib.import_module("tuner.tui.screens.model")
        catalog_entries()

    # --- navigation -------------------------------------------------------------------------
    def action_goto(self, mode: str) -> None:
        self.switch_mode(mode)

    def _step_offset(self, offset: int) -> None:
        current = self.current_mode
        if current in STEP_MODES:
            index = STEP_MODES.index(current) + offset
        else:
            index = 0 if offset > 0 else -1
        if 0 <= index < len(STEP_MODES):
            self.switch_mode(STEP_MODES[index])
        elif index < 0:
            self.switch_mode("start")

    def action_next_step(self) -> None:
        self._step_offset(+1)

    def action_previous_step(self) -> None:
        self._step_offset(-1)

    def chat_with(self, target: str) -> None:
        """Open Chat on ``target`` (a finished run's directory), prefilled and loading."""
        self.chat_target = target
        self.switch_mode("chat")

    def action_help(self) -> None:
        from tuner.tui.screens.help import HelpScreen

        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        """Quit; a launched run is tied to this process, so it is stopped cleanly first (after asking)."""
        if self.run_watch is None or not self.run_watch.running:
            self.exit(0)
            return
        from tuner.tui.screens.confirm import ConfirmScreen

        question = f"A run is going in {self.run_watch.run_dir}. Stop every rank and quit?"
        self.push_screen(ConfirmScreen(question, yes="Stop and quit"),
                         lambda yes: self.stop_and_quit() if yes else None)

    def action_help_quit(self) -> None:
        """Ctrl-C: while a run goes, the offer to stop it (after asking), which Ctrl-X is on the Run screen; else
        Textual's hint that Ctrl-Q quits."""
        from tuner.tui.screens.confirm import ConfirmScreen

        if self.run_watch is None or not self.run_watch.running:
            super().action_help_quit()
        elif not isinstance(self.screen, ConfirmScreen):
            question = (f"A run is going in {self.run_watch.run_dir}. Stop every rank? (Ctrl-X on the Run screen "
                        "stops it too; Ctrl-Q stops it and quits.)")
            self.push_screen(ConfirmScreen(question, yes="Stop the run", no="Keep it running"),
                             lambda yes: self.cancel_run() if yes else None)

    @work(thread=True, group="cancel")
    def stop_and_quit(self, exit_code: int = 0) -> None:
        """Ask the run's follower to stop every rank, wait until it has, then leave."""
        self._stop_run.set()
        while any(worker.group == "run" and not worker.is_finished for worker in self.workers):
            time.sleep(0.1)
        self.call_from_thread(self.exit, exit_code, exit_code)

    def handle_stop_signal(self, signum: int) -> None:
        """SIGTERM or SIGHUP (a closed terminal): no rank may outlive the wizard, which started them in their own
        session, so the run is stopped like Ctrl-C stops it from ``tuner run``."""
        from tuner.launch.run import EXIT_SIGNAL_BASE

        if self.run_watch is not None and self.run_watch.running:
            self.run_watch.cancel()
            self.stop_and_quit(EXIT_SIGNAL_BASE + signum)
        else:
            self.exit(EXIT_SIGNAL_BASE + signum, EXIT_SIGNAL_BASE + signum)

    # --- the draft and its plan -------------------------------------------------------------
    def on_field_edited(self, event: FieldEdited) -> None:
        if event.typed is None and not event.chosen and self.draft.holds(event.changes):
            self.sync_screen()  # an echo of the draft's own value: the widget that sent it shows the draft again
            return
        self.draft.apply(event.changes, typed=event.typed)
        self.draft_changed()

    def on_text_typed(self, event: TextTyped) -> None:
        self.draft_changed()

    def load_draft(self, draft: Draft) -> None:
        """A new recipe (new, opened, built-in or a run's): screens drop what they showed of the old one."""
        self.draft = draft
        self.draft_changed()

    def draft_changed(self) -> None:
        self.replan()
        self.sync_screen()

    def sync_screen(self) -> None:
        """Every widget of the screen shows the draft (what any edit ends with, applied or not)."""
        sync = getattr(self.screen, "sync", None)
        if sync:
            sync()

    def replan(self) -> None:
        start = time.perf_counter()
        recipe = self.draft.plannable
        plan = None
        if recipe is None:
            self.plan_status = "The recipe has errors (listed below the form); the plan follows once they are fixed."
        else:
            try:
                plan = self.planner.plan(recipe)
                self.plan_status = ""
            except CannotPlan as exc:
                self.plan_status = f"no plan: {exc}"
        self.plan = plan
        self.measured = self.planner.measured(recipe) if plan is not None else None
        self.screen.post_message(PlanUpdated(plan, (time.perf_counter() - start) * 1000))
        self.disk_check = None
        if plan is not None:
            self.check_disk(recipe, plan)

    @work(thread=True, exclusive=True, group="disk")
    def check_disk(self, recipe, plan) -> None:
        """Free space under output.dir against what the checkpoints need (file system calls: off the UI thread)."""
        check = self.planner.disk(recipe, plan)
        self.call_from_thread(self._disk_checked, recipe, check)

    def _disk_checked(self, recipe, check) -> None:
        if recipe is self.draft.plannable:  # else an answer about an older draft
            self.disk_check = check
            self.screen.post_message(DiskChecked(check))

    # --- the run ----------------------------------------------------------------------------
    def start_run(self, resume: bool = False, force: bool = False) -> RunWatch:
        """Prepare and launch through the run contract ``tuner run`` uses (tuner.launch.run); ``force`` is the
        explicit override the Run screen offers after a refusal."""
        recipe = self._launchable()
        self._stop_run = threading.Event()
        self.run_watch = RunWatch(run_dir=Path(recipe.output.dir), plan=self.plan, since=time.time(), live=True,
                                  status="checking")
        self.run_recipe(recipe, resume, force, self.run_watch)
        return self.run_watch

    def _launchable(self):
        """The recipe to run or probe; RecipeError while the draft has errors."""
        from tuner.recipe.source import RecipeError

        if self.draft.recipe is None:
            raise RecipeError(["the recipe has errors; fix them first:", *self.draft.errors])
        return self.draft.recipe

    def _said(self, line: str) -> None:
        """A line of the run contract's (a download, stopping every rank) in the Run screen's log."""
        self.post_message(RunEventsArrived([], [line]))

    def _checked(self, watch: RunWatch, check):
        """``check()``'s result, or None once the run contract's refusal is posted for the Run screen."""
        from tuner.catalog.hub import HubError
        from tuner.data.sources import DataError
        from tuner.launch.run import RunRefused
        from tuner.loading.model import ModelLoadError
        from tuner.recipe.source import RecipeError

        try:
            return check()
        except RunRefused as exc:
            self.post_message(RunNotStarted(watch, list(exc.lines), can_override=True))
        except (RecipeError, DataError, ModelLoadError, HubError, OSError) as exc:
            self.post_message(RunNotStarted(watch, str(exc).splitlines()))
        return None

    @work(thread=True, exclusive=True, group="run")
    def run_recipe(self, recipe, resume: bool, force: bool, watch: RunWatch) -> None:
        """Every check, the launch and the follow, off the UI thread (the checks read the data); report back with
        messages."""
        from tuner.launch.run import follow_run, prepare_run

        # a hub model's download is said in the run's log; no terminal progress bar under the wizard
        prepared = self._checked(watch, lambda: prepare_run(recipe, force=force, resume=resume, progress=False,
                                                            say=self._said))
        if prepared is None:
            return
        if not prepared.launchable:
            self.post_message(RunNotStarted(watch, prepared.machine_lines()))
            return
        self.post_message(RunEventsArrived([], [*prepared.notes, f"launching: {prepared.command}"]))
        outcome = follow_run(prepared, stop=self._stop_run,
                             on_update=lambda events, lines: self.post_message(RunEventsArrived(events, lines)),
                             say=self._said)
        self.post_message(RunFinished(outcome.exit_code, outcome.lines))

    def start_probe(self, force: bool = False) -> RunWatch:
        """Probe the recipe on this machine as ``tuner probe`` does (the same run contract); the peak it measures
        then marks the plan bar beside the prediction."""
        from tuner.rundir.layout import PROBE_DIR

        recipe = self._launchable()
        self._stop_run = threading.Event()
        self.run_watch = RunWatch(run_dir=Path(recipe.output.dir) / PROBE_DIR, plan=self.plan, since=time.time(),
                                  live=True, status="checking", kind="probe")
        self.probe_recipe(recipe, force, self.run_watch)
        return self.run_watch

    @work(thread=True, exclusive=True, group="run")
    def probe_recipe(self, recipe, force: bool, watch: RunWatch) -> None:
        from tuner.launch.probe import keep_results, launch_probe, report_lines

        def arrived(events, lines):
            self.post_message(RunEventsArrived(events, lines))

        result = self._checked(watch, lambda: launch_probe(
            recipe, force=force, stop=self._stop_run, on_update=arrived, notes=lambda notes: arrived([], notes),
            say=self._said, progress=False))
        if result is None:
            return
        memory_plan = self.planner.plan(recipe)
        keep_results(result, memory_plan)
        lines = report_lines(result, memory_plan) if result.status == "measured" else result.lines
        self.post_message(RunFinished(result.exit_code, lines))
        self.call_from_thread(self.replan)  # the record just kept: the plan bar's marker

    def cancel_run(self) -> None:
        """Stop every rank (SIGINT, then harder); the follower reports the exit (Ctrl-X, or Ctrl-C confirmed)."""
        if self.run_watch and self.run_watch.running:
            self.run_watch.cancel()
            self._stop_run.set()
            self._show_run()

    def on_run_not_started(self, message: RunNotStarted) -> None:
        message.watch.refuse(message.lines, message.can_override)
        self._show_run()

    def on_run_events_arrived(self, message: RunEventsArrived) -> None:
        if self.run_watch:
            self.run_watch.absorb(message.events, message.log_lines)
            self._show_run()

    def on_run_finished(self, message: RunFinished) -> None:
        if self.run_watch:
            self.run_watch.finish(message.exit_code, message.lines)
            self._show_run()
            self.notify(f"run {self.run_watch.status}: {self.run_watch.run_dir}", timeout=4)

    def _show_run(self) -> None:
        show = getattr(self.screen, "show_run", None)
        if show:
            show()


def run_app() -> int:
    """Open the wizard; returns the process exit code.  What libraries and child processes print meanwhile goes to
    ``$TUNER_HOME/tui.log`` (tuner.tui.output), never over the screen."""
    from tuner.tui.output import library_output_to, log_path

    log = log_path()
    with library_output_to(log):
        app = TunerApp(capture_prints=True)
        code = app.run()
    if getattr(app, "_exception", None) is not None:
        print(f"tuner: the wizard stopped on an internal error; what it printed is in {log}", file=sys.stderr)
    return code or 0
