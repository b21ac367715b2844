"""Terminal progress for a launched run, driven by its events (step, loss, tokens/s, ETA)."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tuner.rundir.events import CheckpointSaved, Error, Event, Step, describe


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

    def update(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Step):  # and Eval
                if self.progress:
                    if self.task is None:
                        self.task = self.progress.add_task("train", total=event.max_steps, info="")
                    self.progress.update(self.task, completed=event.step or 0, info=describe(event))
                else:
                    self.console.print(describe(event), highlight=False)
            elif isinstance(event, CheckpointSaved):
                self.console.print(describe(event), highlight=False, markup=False)
            elif isinstance(event, Error):  # messages quote paths and C++ sources in brackets: never markup
                self.console.print(f"[red]error:[/] {escape(str(event.message))}", highlight=False)
