"""Form fields bound to the draft: each is a view of its draft entries, re-read in ``sync``.

A choice posts :class:`FieldEdited`; a box puts its text into the draft the moment it changes (a box's text
belongs to the draft, so it can never show another recipe's) and posts :class:`TextTyped`.  A choice the recipe
rules refuse is disabled, and the rule's own message is its tooltip (hover); ``reasons`` lists them, and the
screen shows the focused field's reasons (keyboard) in a fixed line below the form, so focus never shifts the
layout under the mouse.  The options of a choice are the schema's own values (:func:`schema_choices`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Checkbox, Input, Label, RadioButton, RadioSet, Select, Static

from tuner.tui.draft import Changes, Draft, schema_values
from tuner.tui.messages import FieldEdited, TextTyped


@dataclass(frozen=True)
class Choice:
    """One option of a choice field and the recipe values it stands for."""

    label: str
    changes: Changes

    def changes_for(self, draft: Draft) -> Changes:
        """What choosing it changes in ``draft`` (the fields it stands for; see :class:`ObjectiveChoice`)."""
        return self.changes

    def chosen_in(self, draft: Draft) -> bool:
        """Whether ``draft`` shows this option as chosen: it holds every value the option stands for."""
        return draft.holds(self.changes)

    def offered_in(self, draft: Draft) -> bool:
        """Whether the option is shown for ``draft`` at all (a MoE model's experts: only for a MoE model)."""
        return True


@dataclass(frozen=True)
class ObjectiveChoice(Choice):
    """An objective: the data follows it where the draft has another objective's example data or layout, and it
    stays chosen while its kind is, whatever its starting values (grpo's micro-batch, rewards) became since."""

    def changes_for(self, draft: Draft) -> Changes:
        return {**self.changes, **draft.data_following(self.changes["objective.kind"])}

    def chosen_in(self, draft: Draft) -> bool:
        return draft.value("objective.kind") == self.changes["objective.kind"]


def schema_labels(field: str, labels: Mapping[Any, str]) -> dict[Any, str]:
    """``labels`` in the order of the schema's values for ``field``; labels for other values than the schema's fail
    here (at import), so a new schema value cannot go missing from a screen nor a removed one linger."""
    values = schema_values(field)
    if set(labels) != set(values):
        raise ValueError(f"{field}: labels for {sorted(map(str, labels))}, the schema has {sorted(map(str, values))}")
    return {value: labels[value] for value in values}


def schema_choices(field: str, labels: Mapping[Any, str] | None = None, choice=Choice) -> list[Choice]:
    """One choice per value the schema allows for ``field`` (its Literal), labelled by ``labels`` (see
    :func:`schema_labels`) or the value itself."""
    named = schema_labels(field, labels) if labels is not None else {value: str(value) for value in schema_values(field)}
    return [choice(label, {field: value}) for value, label in named.items()]


def value_choices(field: str, values: list) -> list[Choice]:
    """One choice per value of a field that is not a Literal (degrees of parallelism), labelled with the value."""
    return [Choice(str(value), {field: value}) for value in values]


def show_reason(line: Static, reason: str | None) -> None:
    """The line under a field: why its value is refused or conflicts (Text: values are never markup)."""
    if getattr(line, "reason", None) != reason:
        line.reason = reason
        line.update(Text(f"✗ {reason}") if reason else "")
        line.display = bool(reason)


class ChoiceRow(RadioSet):
    """The options of a choice: the arrows move one shown option at a time, refused ones too (greyed out, their
    reason below the form), and stop at the ends instead of wrapping, so where a key lands is plain; Enter or Space
    on a refused option says why instead of choosing it."""

    def _move(self, step: int) -> None:
        shown = [index for index, button in enumerate(self._nodes) if button.display]
        if not shown:
            return
        if self._selected not in shown:
            self._selected = shown[0]
            return
        self._selected = shown[max(0, min(shown.index(self._selected) + step, len(shown) - 1))]

    def action_next_button(self) -> None:
        self._move(+1)

    def action_previous_button(self) -> None:
        self._move(-1)

    def action_toggle_button(self) -> None:
        button = self._nodes[self._selected] if self._selected is not None else None
        if button is not None and button.disabled:
            self.notify(f"{button.label}: {button.tooltip}", severity="warning", markup=False)
            return
        super().action_toggle_button()


BUTTON_CELLS = 5  # a radio button's cells beside its label: "▐●▌ " and a space after


class ChoiceField(Vertical):
    """A labelled row of radio buttons; refused options are disabled with their reason."""

    def __init__(self, label: str, choices: list[Choice], *, id: str, help: str = ""):
        super().__init__(id=id, classes="field")
        self.label = label
        self.choices = choices
        self.help = help
        self.reasons: list[str] = []  # "option: why it is refused", for the focused-field line

    def compose(self) -> ComposeResult:
        yield Label(self.label, classes="choice-label")
        with ChoiceRow(id=f"{self.id}-set"):
            for index, choice in enumerate(self.choices):
                yield RadioButton(choice.label, id=f"{self.id}-{index}")
        yield Static("", classes="field-reason")

    @property
    def radio_set(self) -> RadioSet:
        return self.query_one(RadioSet)

    def button(self, label: str) -> RadioButton:
        """The button of the option labelled ``label`` (for tests and help)."""
        index = next(i for i, choice in enumerate(self.choices) if choice.label == label)
        return self.query_one(f"#{self.id}-{index}", RadioButton)

    def on_resize(self, event) -> None:
        self.lay_out(event.size.width)

    def lay_out(self, width: int) -> None:
        """One row where every label fits whole, else a grid of as many columns as the widest label allows: a
        label is never cut (``exact match +``), whatever the terminal's width."""
        buttons = [button for button in self.query(RadioButton) if button.display]
        cells = [len(button.label) + BUTTON_CELLS for button in buttons]
        styles = self.radio_set.styles
        if not cells or sum(cells) <= width:
            layout, columns = "horizontal", 0
        else:
            layout, columns = "grid", max(1, min(len(cells), width // max(cells)))
        if styles.layout is None or styles.layout.name != layout or styles.grid_size_columns != columns:
            styles.layout = layout
            styles.grid_size_columns = columns or 1

    def sync(self, draft: Draft) -> None:
        """Re-check every option against the draft (a keypress's cost: widgets change only when their state does)."""
        refused: dict[str, list[str]] = {}  # reason -> the options it refuses
        chosen_one, shown = False, []
        for choice, button in zip(self.choices, self.query(RadioButton)):
            offered = choice.offered_in(draft)
            shown.append(offered)
            if button.display != offered:
                button.display = offered
            if not offered:
                if button.value:
                    with button.prevent(RadioButton.Changed):
                        button.value = False
                continue
            chosen = not chosen_one and choice.chosen_in(draft)
            chosen_one = chosen_one or chosen
            refusal = None if chosen else draft.refusal(choice.changes_for(draft))
            if button.disabled != (refusal is not None):
                button.disabled = refusal is not None
            tooltip = refusal or self.help or None
            if button.tooltip != tooltip:
                button.tooltip = tooltip
            if refusal:
                field, _, why = refusal.partition(": ")  # the field is this one's own: say only why
                refused.setdefault(why if field in choice.changes else refusal, []).append(choice.label)
            if chosen and not button.value:
                button.value = True  # RadioSet turns the old one off; the echo is ignored below
            elif not chosen and button.value:  # e.g. a file's tp 3, which no option is: none shows as chosen
                with button.prevent(RadioButton.Changed):
                    button.value = False
        if shown != getattr(self, "_shown", shown):
            self.lay_out(self.size.width)
        self._shown = shown
        self.reasons = [f"{', '.join(labels)}: {reason}" for reason, labels in refused.items()]
        fields = dict.fromkeys(field for choice in self.choices for field in choice.changes)
        reason = next((line for line in map(draft.reason, fields) if line), None)
        show_reason(self.query_one(".field-reason", Static), reason)

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        event.stop()
        choice, draft = self.choices[int(event.pressed.id.rsplit("-", 1)[1])], self.app.draft
        if not choice.chosen_in(draft):  # else the echo of sync showing the draft's own choice
            self.post_message(FieldEdited(choice.changes_for(draft), chosen=True))


class ToggleField(Vertical):
    """A checkbox for one boolean field."""

    def __init__(self, label: str, field: str, *, help: str = ""):
        super().__init__(id=field.replace(".", "-"), classes="field toggle")
        self.label = label
        self.field = field
        self.help = help
        self.reasons: list[str] = []

    def compose(self) -> ComposeResult:
        yield Checkbox(self.label, id=f"{self.id}-box", tooltip=self.help or None, compact=True)

    @property
    def checkbox(self) -> Checkbox:
        return self.query_one(Checkbox)

    def sync(self, draft: Draft) -> None:
        box = self.checkbox
        value = bool(draft.value(self.field))
        refusal = draft.refusal({self.field: not value})
        if box.disabled != (refusal is not None):
            box.disabled = refusal is not None
        tooltip = refusal or self.help or None
        if box.tooltip != tooltip:
            box.tooltip = tooltip
        self.reasons = [f"cannot change: {refusal}"] if refusal else []
        if box.value != value:
            with box.prevent(Checkbox.Changed):
                box.value = value

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        event.stop()
        self.post_message(FieldEdited({self.field: event.value}))


def _parse_number(text: str) -> Any:
    text = text.strip()
    if not text:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text  # the field's rule names the field and what it should be


def _parse_text(text: str) -> str | None:
    return text.strip() or None


class InputField(Vertical):
    """A labelled text or number box for one field: a view of the draft's entry, shown as typed; empty means the
    default (or none).

    Its text goes into the draft the moment it changes (a reactive watcher, before any other message is handled),
    and ``sync`` shows the draft's text whatever has focus: so the box and the draft never disagree.  A value the
    field's rule refuses stays in the box, marked, with the rule's reason under it; so does a conflict with other
    fields that names this one.
    """

    def __init__(self, label: str, field: str, *, number: bool = False, placeholder: str = "", help: str = "",
                 apply_on_enter: bool = False):
        super().__init__(id=field.replace(".", "-"), classes="field input")
        self.label = label
        self.field = field
        self.placeholder = placeholder
        self.help = help
        self.parse = _parse_number if number else _parse_text
        self.apply_on_enter = apply_on_enter  # apply on enter or leaving the box, not per keystroke (costly lookups)
        self.pending = False  # typed but not yet applied (apply_on_enter)
        self._showing = False  # the box is being set to the draft's text: not the user's typing

    def compose(self) -> ComposeResult:
        with Horizontal(classes="field-row"):
            yield Label(self.label, classes="field-label")
            yield Input(placeholder=self.placeholder, id=f"{self.id}-input", tooltip=self.help or None, compact=True)
        yield Static("", classes="field-reason")

    def on_mount(self) -> None:
        self.watch(self.box, "value", self._box_changed, init=False)

    @property
    def box(self) -> Input:
        return self.query_one(Input)

    @contextmanager
    def _showing_draft(self):
        self._showing = True
        try:
            with self.box.prevent(Input.Changed):
                yield
        finally:
            self._showing = False

    def sync(self, draft: Draft) -> None:
        box = self.box
        shown = draft.shown(self.field)
        if box.value != shown:
            with self._showing_draft():
                box.value = shown
        box.set_class(self.field in draft.invalid, "-invalid")
        show_reason(self.query_one(".field-reason", Static), draft.reason(self.field))

    def _box_changed(self, text: str) -> None:
        if self._showing:
            return
        draft = self.app.draft
        if self.apply_on_enter:
            draft.hold(self.field, text)
            self.pending = True
            return
        draft.apply({self.field: self.parse(text)}, typed=text)
        self.post_message(TextTyped(self.field))

    def apply_held(self) -> None:
        """Apply the text held for enter (a model id): on enter, on leaving the box, or on leaving the screen."""
        self.pending = False
        text = self.box.value
        self.post_message(FieldEdited({self.field: self.parse(text)}, typed=text))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()  # the draft has it already (_box_changed)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.pending:
            self.apply_held()

    def on_descendant_blur(self) -> None:
        if self.pending:
            self.apply_held()


class SelectField(Vertical):
    """A labelled drop-down for one field; a value outside the list (a custom size) is listed as it is."""

    def __init__(self, label: str, field: str, options: list[str], *, prompt: str, help: str = ""):
        super().__init__(id=field.replace(".", "-"), classes="field input")
        self.label = label
        self.field = field
        self.options = options
        self.prompt = prompt
        self.help = help
        self.listed = list(options)

    def compose(self) -> ComposeResult:
        with Horizontal(classes="field-row"):
            yield Label(self.label, classes="field-label")
            yield Select([(name, name) for name in self.options], prompt=self.prompt, id=f"{self.id}-select",
                         compact=True, tooltip=self.help or None)
        yield Static("", classes="field-reason")

    @property
    def select(self) -> Select:
        return self.query_one(Select)

    def sync(self, draft: Draft) -> None:
        select = self.select
        value = draft.value(self.field)
        listed = [*self.options, *([value] if value is not None and value not in self.options else [])]
        if listed != self.listed:
            self.listed = listed
            with select.prevent(Select.Changed):
                select.set_options([(name, name) for name in listed])
        wanted = Select.NULL if value is None else value
        if select.value != wanted:
            with select.prevent(Select.Changed):
                select.value = wanted
        show_reason(self.query_one(".field-reason", Static), draft.reason(self.field))

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.post_message(FieldEdited({self.field: None if event.value is Select.NULL else event.value}))
