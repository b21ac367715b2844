"""Run: launch through the run contract ``tuner run`` uses; watch log, progress, loss, speed and memory; read the
refusal, the per-machine commands or the summary it ends with.

The app owns the run (a worker follows it), so leaving this screen never stops it.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, ProgressBar, RichLog, Sparkline, Static

from tuner.recipe.source import RecipeError
from tuner.tui.run_watch import LOG_LINES, RunWatch, replay
from tuner.tui.screens.base import WizardScreen


def _memory_line(watch: RunWatch) -> str:
    """Measured peak memory (the highest rank, and every rank when there are several) beside the plan."""
    if not watch.memory_gib:
        return "memory: not measured yet"
    parts = []
    for name, peak in watch.memory_gib.items():
        ranks = watch.memory_per_rank.get(name)
        each = f" (ranks: {' / '.join(f'{value:.2f}' for value in ranks)})" if ranks else ""
        parts.append(f"{name.replace('_', ' ')} {peak:.2f} GiB{each}")
    planned = ""
    if watch.plan is not None:
        device = watch.plan.gpu
        capacity = f" of {device.capacity_gib:.2f}" if device.capacity_gib is not None else ""
        planned = f"  ·  plan: {device.total_gib:.2f}{capacity} GiB per device"
    return f"peak memory: {', '.join(parts)}{planned}"


def status_line(watch: RunWatch) -> str:
    parts = [f"{watch.status}", f"step {watch.step}/{watch.max_steps or '?'}"]
    if watch.losses:
        parts.append(f"loss {watch.losses[-1]:.4f}")
    if watch.eval_losses:
        parts.append(f"eval loss {watch.eval_losses[-1]:.4f}")
    if watch.rollout:
        parts.append(watch.rollout)
    if watch.tokens_per_s is not None:
        parts.append(f"{watch.tokens_per_s:,.0f} tokens/s")
    if watch.running:
        left = watch.eta_left()
        if left is None:
            parts.append("ETA after the first logged steps")
        else:
            parts.append(f"ETA {left:.0f} s" if left >= 1 else "finishing (evaluation and saving)")
    return "  ·  ".join(parts)


def loss_line(watch: RunWatch) -> str:
    if not watch.losses:
        return "loss: no logged step yet"
    first, last = watch.losses[0], watch.losses[-1]
    if len(watch.losses) == 1:
        return f"loss {first:.4f} at the first logged step; the curve starts at the second"
    return f"loss {first:.4f} → {last:.4f} over {len(watch.losses)} logged steps (min {min(watch.losses):.4f})"


class RunLog(RichLog):
    """The run's log, kept at its end when its box changes height too (the summary above it appears as the run
    ends, the terminal is resized): a write alone scrolls to the end of the box as it was."""

    def on_resize(self) -> None:
        if self.auto_scroll:
            self.scroll_end(animate=False, immediate=False, x_axis=False)


class RunScreen(WizardScreen):
    STEP = "run"
    BINDINGS = [
        Binding("ctrl+r", "launch", "Launch", id="launch", tooltip="Write the run directory and start training"),
        Binding("ctrl+x", "cancel", "Cancel run", id="cancel", tooltip="Stop every rank cleanly"),
        Binding("ctrl+e", "resume", "Resume", id="resume", tooltip="Continue from the newest checkpoint"),
        Binding("ctrl+t", "chat", "Chat with this run", id="chat_with_run",
                tooltip="Open Chat with this run's trained model (once the run has finished)"),
        Binding("ctrl+p", "probe", "Probe", id="probe",
                tooltip="Measure the recipe on this machine (a few steps on worst-case batches) beside the plan"),
    ]

    def compose_body(self) -> ComposeResult:
        self._log_shown = 0
        self._log_watch = None
        with Vertical(classes="body", id="run-body"):
            yield Static("", id="run-dir")
            with Horizontal(id="run-buttons"):
                yield Button("Launch ^r", id="launch", variant="primary", compact=True)
                yield Button("Cancel ^x", id="cancel", variant="error", compact=True)
                yield Button("Resume ^e", id="resume", compact=True)
                yield Button("Probe ^p", id="probe", compact=True)
                yield Button("Launch anyway", id="override", variant="warning", compact=True)
                yield Button("Chat with this run ^t", id="chat", variant="success", compact=True)
            yield Static("", id="run-summary")  # the refusal, the per-machine commands or the finished run's summary
            yield Static("", id="run-status")
            yield ProgressBar(id="progress", show_eta=False)
            yield Static("", id="loss-line")
            yield Sparkline([], id="loss")
            yield Static("", id="memory")
            yield RunLog(id="log", max_lines=LOG_LINES, wrap=True, markup=False, highlight=False)

    def on_mount(self) -> None:
        super().on_mount()
        self.set_interval(1.0, self._tick)

    def _tick(self) -> None:
        """The ETA counts down between the run's events; a run another tuner runs (opened from Recent runs) is
        re-read from its run directory."""
        watch = self.app.run_watch
        if watch is None or not self.is_current:
            return
        if watch.running:
            self.query_one("#run-status", Static).update(status_line(watch))
        elif not watch.live and watch.status.startswith("running"):
            self.app.run_watch = replay(watch.run_dir)
            self.show_run()

    def sync(self) -> None:
        super().sync()
        self.show_run()

    def show_run(self) -> None:
        watch = self.app.run_watch
        running = bool(watch and watch.running)
        self.query_one("#launch", Button).disabled = running or not self.app.draft.valid
        self.query_one("#cancel", Button).disabled = not running
        self.query_one("#resume", Button).disabled = running or not self.app.draft.valid
        self.query_one("#probe", Button).disabled = running or not self.app.draft.valid
        override = self.query_one("#override", Button)
        override.display = bool(watch and watch.can_override and not running)
        self.query_one("#chat", Button).display = bool(watch and watch.status == "finished")
        progress = self.query_one("#progress", ProgressBar)
        progress.display = bool(watch and watch.max_steps)  # no animation before there is anything to measure
        chart = self.query_one("#loss", Sparkline)
        chart.display = bool(watch and len(watch.losses) > 1)  # one point is not a curve
        self.refresh_bindings()  # ^t only once there is a finished run to chat with
        summary = self.query_one("#run-summary", Static)
        summary.update(Text("\n".join(watch.outcome)) if watch else "")
        summary.display = bool(watch and watch.outcome)  # no blank line until there is something to say
        self.query_one("#run-status", Static).display = watch is not None
        for name in ("#loss-line", "#memory"):  # nothing to say about a run that has not started
            self.query_one(name, Static).display = watch is not None and watch.status not in ("not started", "checking")
        if watch is None:
            recipe = self.app.draft.recipe
            where = recipe.output.dir if recipe else "(fix the recipe first)"
            self.query_one("#run-dir", Static).update(Text(f"not launched yet; the run will write {where}"))
            return
        self.query_one("#run-dir", Static).update(Text(f"run directory: {watch.run_dir}  (full log: train.log)"))
        self.query_one("#run-status", Static).update(status_line(watch))
        if watch.max_steps:
            progress.update(total=watch.max_steps, progress=watch.step)
        self.query_one("#loss-line", Static).update(loss_line(watch))
        chart.data = list(watch.losses)
        self.query_one("#memory", Static).update(_memory_line(watch))
        log = self.query_one("#log", RichLog)
        if self._log_watch is not watch:
            log.clear()
            self._log_watch, self._log_shown = watch, 0
        new, restart = watch.log_since(self._log_shown)
        if restart:
            log.clear()
        for line in new:
            log.write(Text(line))
        self._log_shown = watch.logged

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "chat":
            watch = self.app.run_watch
            return watch is not None and watch.status == "finished"
        return True

    def action_chat(self) -> None:
        watch = self.app.run_watch
        if watch is not None and watch.status == "finished":
            self.app.chat_with(str(watch.run_dir))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        {"launch": self.action_launch, "cancel": self.action_cancel, "resume": self.action_resume,
         "override": self.action_override, "chat": self.action_chat, "probe": self.action_probe}[event.button.id]()

    def action_launch(self) -> None:
        self._launch(resume=False)

    def action_resume(self) -> None:
        self._launch(resume=True)

    def action_override(self) -> None:
        """The explicit override of the refusal shown above (what ``--force`` is to ``tuner run``)."""
        watch = self.app.run_watch
        if watch is not None and watch.can_override:
            self._launch(resume=False, force=True, probe=watch.kind == "probe")

    def action_probe(self) -> None:
        """``tuner probe``: its measurements end up in the log and summary, its peak on the plan bar."""
        self._launch(resume=False, probe=True)

    def _launch(self, resume: bool, force: bool = False, probe: bool = False) -> None:
        if not self.app.draft.valid or (self.app.run_watch and self.app.run_watch.running):
            return
        try:
            if probe:
                self.app.start_probe(force=force)
            else:
                self.app.start_run(resume=resume, force=force)
        except RecipeError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.show_run()

    def action_cancel(self) -> None:
        self.app.cancel_run()
