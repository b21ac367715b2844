"""Terminal progress for a launched run, driven by its events (step, loss, tokens/s, ETA)."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def step_summary(event: dict) -> str:
    from tuner.rundir.events import rollout_summary

    parts = [f"step {event.get('step')}/{event.get('max_steps')}"]
    if "loss" in event:
        parts.append(f"loss {event['loss']:.4f}")
    if "eval_loss" in event:
        parts.append(f"eval_loss {event['eval_loss']:.4f}")
    parts += [summary for summary in (rollout_summary(event), rollout_summary(event, "eval_")) if summary]
    if "tokens_per_s" in event:
        parts.append(f"{event['tokens_per_s']:.0f} tok/s")
    if "eta_s" in event:
        parts.append(f"eta {event['eta_s']:.0f}s")
    return "  ".join(parts)


class ProgressView:
    """A rich progress bar on a terminal; one plain line per event otherwise (logs, CI)."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=False)
        self.interactive = self.console.is_terminal and sys.stdout.isatty()
        self.progress = Progress(
            TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(), console=self.console, transient=False,
        ) if self.interactive else None
        self.task = None

    def __enter__(self):
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.progress.stop()

    def update(self, events: list[dict]) -> None:
        for event in events:
            kind = event.get("event")
            if kind in ("step", "eval"):
                if self.progress:
                    if self.task is None:
                        self.task = self.progress.add_task("train", total=event.get("max_steps"), info="")
                    self.progress.update(self.task, completed=event.get("step", 0), info=step_summary(event))
                else:
                    self.console.print(step_summary(event), highlight=False)
            elif kind == "checkpoint":
                self.console.print(f"checkpoint saved: {event.get('path')}", highlight=False, markup=False)
            elif kind == "error":  # messages quote paths and C++ sources in brackets: never markup
                self.console.print(f"[red]error:[/] {escape(str(event.get('message')))}", highlight=False)
