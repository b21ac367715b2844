"""What every wizard step shares: the step bar, the draft's errors, the footer, ``sync`` from the draft."""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from tuner.tui.widgets.steps import StepBar

if TYPE_CHECKING:
    from tuner.tui.app import TunerApp


class WizardScreen(Screen):
    """A step of the wizard; subclasses yield their form in ``compose_body``."""

    STEP = ""

    app: "TunerApp"

    def compose(self) -> ComposeResult:
        yield Header()
        yield StepBar(self.STEP)
        yield from self.compose_body()
        yield Static("", id="errors")
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()

    def on_screen_resume(self) -> None:
        self.sync()

    def on_mount(self) -> None:
        self.sync()

    def sync(self) -> None:
        """Re-read everything shown from the app's draft."""
        draft = self.app.draft
        for field in self.query("ChoiceField, ToggleField, InputField"):
            field.sync(draft)
        errors = self.query_one("#errors", Static)
        errors.update("\n".join(f"✗ {line}" for line in draft.errors))
        errors.display = bool(draft.errors)
