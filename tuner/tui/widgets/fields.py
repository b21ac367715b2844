"""Form fields bound to the draft: each posts :class:`FieldEdited` and re-reads the draft in ``sync``.

A choice the recipe rules refuse is disabled, and the rule's own message is its tooltip
(hover); ``reasons`` lists them, and the screen shows the focused field's reasons (keyboard)
in a fixed line below the form, so focus never shifts the layout under the mouse.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Checkbox, Input, Label, RadioButton, RadioSet

from tuner.tui.draft import Changes, Draft
from tuner.tui.messages import FieldEdited


@dataclass(frozen=True)
class Choice:
    """One option of a choice field and the recipe values it stands for."""

    label: str
    changes: Changes


def value_choices(field: str, values: list) -> list[Choice]:
    """One choice per value of a single field, labelled with the value itself."""
    return [Choice(str(value), {field: value}) for value in values]


class ChoiceField(Vertical):
    """A labelled row of radio buttons; refused options are disabled with their reason."""

    def __init__(self, label: str, choices: list[Choice], *, id: str, help: str = ""):
        super().__init__(id=id, classes="field")
        self.label = label
        self.choices = choices
        self.help = help
        self.reasons: list[str] = []  # "option: why it is refused", for the focused-field line

    def compose(self) -> ComposeResult:
        yield Label(self.label, classes="field-label")
        with RadioSet(id=f"{self.id}-set"):
            for index, choice in enumerate(self.choices):
                yield RadioButton(choice.label, id=f"{self.id}-{index}")

    @property
    def radio_set(self) -> RadioSet:
        return self.query_one(RadioSet)

    def button(self, label: str) -> RadioButton:
        """The button of the option labelled ``label`` (for tests and help)."""
        index = next(i for i, choice in enumerate(self.choices) if choice.label == label)
        return self.query_one(f"#{self.id}-{index}", RadioButton)

    def sync(self, draft: Draft) -> None:
        reasons = []
        for index, choice in enumerate(self.choices):
            button = self.query_one(f"#{self.id}-{index}", RadioButton)
            chosen = draft.holds(choice.changes)
            refusal = None if chosen else draft.refusal(choice.changes)
            button.disabled = refusal is not None
            button.tooltip = refusal or self.help or None
            if refusal:
                reasons.append(f"{choice.label}: {refusal}")
            if chosen and not button.value:
                button.value = True  # RadioSet turns the old one off; the echo is ignored below
        self.reasons = reasons

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        event.stop()
        index = int(event.pressed.id.rsplit("-", 1)[1])
        self.post_message(FieldEdited(self.choices[index].changes))


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
        box.disabled = refusal is not None
        box.tooltip = refusal or self.help or None
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
    return text  # validation names the field and what it should be


def _parse_text(text: str) -> str | None:
    return text.strip() or None


def _show(value: Any) -> str:
    return "" if value is None else str(value)


class InputField(Horizontal):
    """A labelled text or number input for one field; empty means the default (or none)."""

    def __init__(self, label: str, field: str, *, number: bool = False, placeholder: str = "", help: str = "",
                 apply_on_enter: bool = False):
        super().__init__(id=field.replace(".", "-"), classes="field input")
        self.label = label
        self.field = field
        self.placeholder = placeholder
        self.help = help
        self.parse = _parse_number if number else _parse_text
        self.typing = False  # the user edited the box since it took focus
        self.apply_on_enter = apply_on_enter  # apply on enter or leaving the box, not per keystroke (costly lookups)

    def compose(self) -> ComposeResult:
        yield Label(self.label, classes="field-label")
        yield Input(placeholder=self.placeholder, id=f"{self.id}-input", tooltip=self.help or None, compact=True)

    def sync(self, draft: Draft) -> None:
        box = self.query_one(Input)
        if box.has_focus and self.typing:
            return  # never fight the user's typing
        shown = _show(draft.value(self.field))
        if self.parse(box.value) != self.parse(shown):
            with box.prevent(Input.Changed):
                box.value = shown

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.typing = True
        if not self.apply_on_enter:
            self.post_message(FieldEdited({self.field: self.parse(event.value)}))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(FieldEdited({self.field: self.parse(event.value)}))

    def on_descendant_blur(self) -> None:
        if self.apply_on_enter and self.typing:
            self.post_message(FieldEdited({self.field: self.parse(self.query_one(Input).value)}))
        self.typing = False
