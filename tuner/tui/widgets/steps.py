"""The wizard's step bar: where you are, and a click (or ctrl+n / esc) away from the other steps."""
from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

STEPS = (
    ("model", "Model"),
    ("hardware", "Hardware"),
    ("method", "Method"),
    ("data", "Data"),
    ("training", "Training"),
    ("review", "Review"),
    ("run", "Run"),
)


class StepBar(Static):
    def __init__(self, current: str):
        super().__init__(classes="steps")
        self.current = current

    def on_mount(self) -> None:
        parts = []
        for number, (mode, title) in enumerate(STEPS, start=1):
            style = "reverse bold" if mode == self.current else "dim"
            parts.append(Content.from_markup(f"[{style} @click=app.goto('{mode}')] {number} {title} [/]"))
        self.update(Content(" ").join(parts))
