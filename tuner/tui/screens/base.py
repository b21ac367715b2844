"""What every wizard step shares: the step bar, the draft's errors, the footer, ``sync`` from the draft."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from tuner.tui.app import NARROW_BELOW  # noqa: F401  (screens read it here)
from tuner.tui.widgets.fields import ChoiceField, InputField, ToggleField
from tuner.tui.widgets.steps import StepBar

if TYPE_CHECKING:
    from tuner.tui.app import TunerApp

MAX_ERROR_LINES = 4


class WizardScreen(Screen):
    """A step of the wizard; subclasses yield their form in ``compose_body``."""

    STEP = ""

    app: "TunerApp"

    def compose(self) -> ComposeResult:
        yield Header()
        yield StepBar(self.STEP)
        yield from self.compose_body()
        with VerticalScroll(id="why-box", can_focus=False):  # a fixed height: focus never moves the form
            yield Static("", id="why")
        yield Static("", id="errors")
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()

    def on_screen_resume(self) -> None:
        self.sync()

    def on_screen_suspend(self) -> None:
        """Leaving the step (its focused box keeps focus, so no blur comes): a typed model id is applied."""
        for field in self.query(InputField):
            if field.pending:
                field.apply_held()

    def on_mount(self) -> None:
        self.sync()

    @property
    def fields(self) -> list:
        """The form's fields bound to the draft (found once: a query per keypress costs more than the checks)."""
        if not getattr(self, "_fields", None):
            self._fields = list(self.query("ChoiceField, ToggleField, InputField, SelectField"))
        return self._fields

    def sync(self) -> None:
        """Re-read everything shown from the app's draft."""
        draft = self.app.draft
        for field in self.fields:
            field.sync(draft)
        self.show_reasons()
        self.show_errors()

    def found_errors(self) -> list[str]:
        """Errors this step found beyond the draft's own (the Data step's: data the objective cannot read)."""
        return []

    def show_errors(self) -> None:
        lines = [f"✗ {line}" for line in [*self.app.draft.errors, *self.found_errors()]]
        if len(lines) > MAX_ERROR_LINES:
            lines[MAX_ERROR_LINES - 1:] = [f"  … and {len(lines) - MAX_ERROR_LINES + 1} more; fix these first"]
        errors = self.query_one("#errors", Static)
        errors.update(Text("\n".join(lines)))
        errors.display = bool(lines)

    def on_descendant_focus(self) -> None:
        self.show_reasons()

    def show_reasons(self) -> None:
        """Why the focused field's greyed-out choices are refused (empty when it has none)."""
        field = next((node for node in (self.focused.ancestors_with_self if self.focused else [])
                      if isinstance(node, (ChoiceField, ToggleField))), None)
        self.query_one("#why", Static).update(Text("\n".join(field.reasons)) if field else "")
