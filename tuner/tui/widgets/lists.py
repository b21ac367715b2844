"""A list you can tab into and press enter on: the first choosable entry is highlighted when it takes focus."""
from __future__ import annotations

from textual.widgets import OptionList


class PickList(OptionList):
    def on_focus(self) -> None:
        if self.highlighted is None or self.options[self.highlighted].disabled:
            self.highlight_first()

    def highlight_first(self) -> None:
        """Highlight the first entry that can be chosen (none when all are disabled)."""
        self.highlighted = next((index for index, option in enumerate(self.options) if not option.disabled), None)
