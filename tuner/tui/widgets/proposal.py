"""The Auto-fit proposal: the changes Enter applies, one per line, wrapped at the panel's width without cutting a
word."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


def change_lines(line: str, width: int, indent: int = 2) -> list[str]:
    """A change line (``memory.gradient_checkpointing: false → true``) in lines of at most ``width``: whole where it
    fits, else the field, then its values below it; a field longer than a line breaks after a dot.  Never inside a
    word: what is cut cannot be read (``memory.gradient_checkpointin`` / ``g: false → true``)."""
    if indent + len(line) <= width:
        return [" " * indent + line]
    key, _, values = line.partition(": ")
    out, current = [], ""
    for part in key.replace(".", ". ").split(" "):  # the field's parts, each dot kept with the part before it
        if current and indent + len(current) + len(part) + 1 > width:
            out.append(current)
            current = ""
        current += part
    out.append(current + ":")
    lines = [" " * indent + part for part in out]
    words, current = values.split(" "), " " * (indent + 2)  # the values, indented under the field, whole words
    for word in words:
        if current.strip() and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = " " * (indent + 2)
        current += (" " if current.strip() else "") + word
    return lines + [current]


class Proposal(Static):
    """What Enter applies: a heading and one change per line, laid out at the panel's own width (see
    :func:`change_lines`); or a sentence (``update``)."""

    changes: list[str] = []

    def show_changes(self, heading: str, changes: list[str]) -> None:
        self.update("")
        self.heading, self.changes = heading, changes
        self.refresh(layout=True)

    def update(self, content="", **kwargs) -> None:
        self.changes = []
        super().update(content, **kwargs)

    def render(self):
        if not self.changes:
            return super().render()
        width = self.size.width or 80
        text = Text(self.heading, style="bold")
        for line in self.changes:
            text.append("\n" + "\n".join(change_lines(line, width)))
        return text
