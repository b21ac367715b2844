"""Model: pick from the offline catalog, or type a local path or hub id; see the facts used for planning: the
architecture, a MoE model's experts and active parameters, the layer kinds, and any part the planner cannot judge."""
from __future__ import annotations

from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option, OptionDoesNotExist

from tuner.catalog.demo import DEMO_MODEL_ID
from tuner.catalog.hub import is_hub_id
from tuner.planner.vision import NAMES
from tuner.tui.catalog import ModelEntry, catalog_entries, describe_model
from tuner.tui.messages import FieldEdited
from tuner.tui.screens.base import NARROW_BELOW, WizardScreen
from tuner.tui.widgets.fields import InputField
from tuner.tui.widgets.lists import PickList


ID_COLUMN = 34  # the ids' column in a wide list (most ids fit)
HEADLINE = ("parameters", "active / total", "experts", "experts / token")  # shown before the layer kinds


class ModelScreen(WizardScreen):
    STEP = "model"

    def compose_body(self) -> ComposeResult:
        self.entries = catalog_entries()
        self.shown_draft = None  # the draft the search was typed for: a new recipe starts unfiltered
        with Horizontal(classes="body"):
            with Vertical(id="model-pick", classes="form"):
                yield Input(placeholder="search: family, size (8b) or name",
                            id="model-search", compact=True)
                yield PickList(id="model-list")
                yield InputField("Model", "model.id", placeholder=f"hub org/name, local directory or {DEMO_MODEL_ID}",
                                 help="What to fine-tune; the list above fills this in. Enter applies a typed id.",
                                 apply_on_enter=True)
            with VerticalScroll(id="model-facts", classes="side"):
                yield Label("Architecture", classes="section-title")
                yield Static("", id="facts")

    def on_mount(self) -> None:
        self._fill_list("")
        super().on_mount()
        self.query_one("#model-search", Input).focus()  # where the user types; Tab, or enter, moves to the list

    def _fill_list(self, query: str) -> None:
        """The entries ``query`` matches, the recipe's own model first where the catalog does not list it (an
        opened recipe's Llama-3.1-70B-Instruct), each on one row of the list's width."""
        listing = self.query_one("#model-list", OptionList)
        listing.clear_options()
        model_id = self.app.draft.value("model.id")
        entries = self.entries if any(entry.id == model_id for entry in self.entries) else [
            describe_model(model_id, self.entries), *self.entries]
        narrow = self.app.size.width < NARROW_BELOW  # 80 columns: the id and its size; the facts show the rest
        if not listing.scrollable_content_region.width and not getattr(self, "_relaid", False):
            self._relaid = True  # not laid out yet: again once it is
            self.call_after_refresh(lambda: self._fill_list(self.query_one("#model-search", Input).value))
        width = (listing.scrollable_content_region.width or self.app.size.width // 2) - (  # the bar the rows bring
            0 if listing.show_vertical_scrollbar else listing.styles.scrollbar_size_vertical)
        column = min(ID_COLUMN, width - max(len(entry.summary) for entry in entries) - 1)
        for entry in entries:
            if entry.matches(query) or entry.id == model_id and not query:
                shown = f"{entry.id:<{column}} {entry.summary}"
                if narrow or len(shown) > width or not entry.summary:  # a row never wraps: the facts say the rest
                    shown = f"{entry.id}  {entry.size}".rstrip()
                if len(shown) > width:  # the id alone (an id wider than the list wraps: no name is cut)
                    shown = entry.id
                listing.add_option(Option(shown, id=entry.id))
        self._highlight_current()

    def _highlight_current(self) -> None:
        """The recipe's model highlighted; none where the search filters it out (never another model)."""
        listing = self.query_one("#model-list", OptionList)
        try:
            listing.highlighted = listing.get_option_index(self.app.draft.value("model.id"))
        except OptionDoesNotExist:  # filtered out
            listing.highlighted = None

    def on_resize(self) -> None:
        """Rows laid out for the list's new width, once the resize has laid the list out."""
        self.call_after_refresh(lambda: self._fill_list(self.query_one("#model-search", Input).value))

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "model-search":
            self._fill_list(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the search: a single match is taken; several move to the list to choose; a hub id (org/name)
        nothing listed matches is looked up on the hub."""
        if event.input.id != "model-search":
            return
        listing = self.query_one("#model-list", OptionList)
        if listing.option_count == 1:
            self.post_message(FieldEdited({"model.id": listing.get_option_at_index(0).id}))
        elif listing.option_count:
            listing.focus()
        elif is_hub_id(event.value.strip()):
            self.post_message(FieldEdited({"model.id": event.value.strip()}))

    def on_field_edited(self, event: FieldEdited) -> None:
        """A typed model id may need the hub (its config.json, fetched once): look it up off the UI thread first."""
        model_id = event.changes.get("model.id")
        if not model_id or any(entry.id == model_id for entry in self.entries):
            return
        event.stop()
        self.query_one("#facts", Static).update(f"looking up {escape(model_id)}…")
        self.look_up(model_id, event.typed)

    @work(thread=True, exclusive=True)
    def look_up(self, model_id: str, typed: str | None) -> None:
        describe_model(model_id, self.entries)  # warms the facts cache (a hub's answer, or its refusal), so
        self.app.call_from_thread(self._take_model, model_id, typed)  # planning and sync() ask no network

    def _take_model(self, model_id: str, typed: str | None) -> None:
        self.app.draft.apply({"model.id": model_id}, typed=typed)
        self.app.draft_changed()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.post_message(FieldEdited({"model.id": event.option.id}))

    def sync(self) -> None:
        super().sync()
        if self.shown_draft is not self.app.draft:  # a new recipe: no filter left over from the last one
            self.shown_draft = self.app.draft
            search = self.query_one("#model-search", Input)
            if search.value:
                search.value = ""  # refills the list
        self._highlight_current()
        model_id = self.app.draft.value("model.id")
        self.query_one("#facts", Static).update(facts_text(describe_model(model_id, self.entries),
                                                           self.app.draft.value("method.train")))


def facts_text(entry: ModelEntry, train=()) -> str:
    """The side panel: the id, where its facts come from (or why there are none); what the planner cannot judge
    first, then the size (a MoE model's experts and active parameters), the layer kinds, the other facts (the
    panel scrolls on a small terminal)."""
    if entry.error:
        return f"[b]{escape(entry.id)}[/b]\n\n[$error]{escape(entry.error)}[/]"
    lines = [f"[b]{escape(entry.id)}[/b]", f"[dim]{escape(entry.source)}[/dim]"]
    if entry.cannot_judge:
        lines += ["", *(f"[b $warning]{escape(line)}[/]" for line in entry.judgement_lines),
                  "[dim]every plan of it says cannot judge; tuner plan --simulate traces the real step[/dim]"]
    first = [label for label in HEADLINE if label in entry.facts]
    rest = [label for label in entry.facts if label not in HEADLINE]
    lines += ["", *(f"{label:<16} {escape(str(entry.facts[label]))}" for label in first)]
    if entry.parts:  # an image-text model: its parts, and what method.train trains (the Method step sets it)
        lines += ["[b]image-text parts[/b]", *(escape(part) for part in entry.parts),
                  f"trains           {escape(', '.join(NAMES[part] for part in train))} (method.train); "
                  "the other parts are loaded and frozen"]
    if entry.layer_kinds:
        lines += ["[b]layer kinds[/b]", *(escape(kind) for kind in entry.layer_kinds)]
    lines += [f"{label:<16} {escape(str(entry.facts[label]))}" for label in rest]
    return "\n".join(lines)
