"""Model: pick from the offline catalog, or type a local path or hub id; see the facts used for planning."""
from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from tuner.tui.catalog import catalog_entries, describe_model
from tuner.tui.messages import FieldEdited
from tuner.tui.screens.base import WizardScreen
from tuner.tui.widgets.fields import InputField


class ModelScreen(WizardScreen):
    STEP = "model"

    def compose_body(self) -> ComposeResult:
        self.entries = catalog_entries()
        with Horizontal(classes="body"):
            with Vertical(id="model-pick", classes="form"):
                yield Input(placeholder="search: family, size, name", id="model-search", compact=True)
                yield OptionList(id="model-list")
                yield InputField("Model", "model.id", placeholder="hub org/name, local directory or builtin:demo",
                                 help="What to fine-tune; the list above fills this in. Enter applies a typed id.",
                                 on_submit=True)
            with Vertical(id="model-facts", classes="side"):
                yield Label("Architecture", classes="section-title")
                yield Static("", id="facts")

    def on_mount(self) -> None:
        self._fill_list("")
        super().on_mount()
        self.query_one("#model-list", OptionList).focus()

    def _fill_list(self, query: str) -> None:
        listing = self.query_one("#model-list", OptionList)
        listing.clear_options()
        for entry in self.entries:
            if entry.matches(query):
                listing.add_option(Option(f"{entry.id:<34} {entry.summary}", id=entry.id))

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "model-search":
            self._fill_list(event.value)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.post_message(FieldEdited({"model.id": event.option.id}))

    def sync(self) -> None:
        super().sync()
        model_id = self.app.draft.value("model.id")
        source, facts = describe_model(model_id, self.entries)
        lines = [f"[b]{escape(model_id)}[/b]", f"[dim]{escape(source)}[/dim]", ""]
        lines += [f"{label:<16} {escape(str(value))}" for label, value in facts.items()]
        self.query_one("#facts", Static).update("\n".join(lines))
