"""Terminal progress for a launched run, driven by its events (step, loss, tokens/s, ETA)."""
from __future__ import annotations

import sys
import time
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tuner.rundir.events import CheckpointSaved, Error, Eval, Event, Step, describe


# Off a terminal (a log, CI, a pipe) one whole progress line at most this often, besides the first and last step's
# and every evaluation's: a log of a long run stays readable, and a line is never cut into pieces.
PLAIN_EVERY_S = 30.0


class ProgressView:
    """A rich progress bar on a terminal; otherwise whole plain lines, one per :data:`PLAIN_EVERY_S` seconds."""

    def __init__(self, console: Console | None = None, clock: Callable[[], float] = time.monotonic):
        self.console = console or Console(stderr=False)
        self.clock = clock
        self.last_line: float | None = None  # when the last plain step line was printed
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
                elif self._line_due(event):
                    self.console.print(describe(event), highlight=False, markup=False, soft_wrap=True)
            elif isinstance(event, CheckpointSaved):
                self.console.print(describe(event), highlight=False, markup=False)
            elif isinstance(event, Error):  # messages quote paths and C++ sources in brackets: never markup
                self.console.print(f"[red]error:[/] {escape(str(event.message))}", highlight=False)

    def _line_due(self, step: Step) -> bool:
        """Whether a plain step line is printed now: an evaluation, the first or last step, or the interval passed."""
        now = self.clock()
        due = (isinstance(step, Eval) or self.last_line is None or now - self.last_line >= PLAIN_EVERY_S
               or (step.max_steps is not None and step.step == step.max_steps))
        if due and not isinstance(step, Eval):
            self.last_line = now
        return due
