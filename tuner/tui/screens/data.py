"""Data: source and format, and one training example as the model sees it, the loss-free part shaded."""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.worker import get_current_worker
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, Static

from tuner.tui.preview import Preview, PreviewProcess
from tuner.tui.screens.base import WizardScreen
from tuner.tui.widgets.fields import ChoiceField, InputField, ToggleField, schema_choices

MASKED_STYLE = "#8a8a8a on #303030"
LEARNED_STYLE = "bold #87d787"
DATA_FIELDS = ("data.", "objective.kind:")  # a data error naming one of these is the recipe's to fix
PREVIEW_KEYS = ("objective.kind", "data.source", "data.split", "data.format", "data.train_on_prompt",
                "data.max_samples", "training.seed", "training.max_seq_length", "model.id")


@dataclass
class PreviewLoaded(Message):
    """The child process's answer to the preview question ``key``."""

    key: tuple
    answer: Preview


def preview_text(segments: list[tuple[str, bool]]) -> Text:
    text = Text()
    for part, trainable in segments:
        text.append(part, LEARNED_STYLE if trainable else MASKED_STYLE)
    return text


class DataScreen(WizardScreen):
    STEP = "data"

    def __init__(self) -> None:
        super().__init__()
        self.preview_key: tuple | None = None
        self.data_problem: str | None = None  # the data does not fit the recipe (an objective's layout, its columns)
        self.preview: Text | None = None  # the example as shown, styled per segment
        self.preview_pid: int | None = None  # the process that made it
        self.preview_pending = False  # asked, not answered yet
        self.previews = PreviewProcess()

    def compose_body(self) -> ComposeResult:
        with Horizontal(classes="body"):
            with VerticalScroll(classes="form", can_focus=False):  # scrolls on a short terminal
                yield InputField("Source", "data.source", placeholder="file.jsonl, cached dataset name or builtin:reverse")
                yield InputField("Split", "data.split")
                yield ChoiceField("Format", schema_choices("data.format"), id="data-format")
                yield ToggleField("Loss on the prompt too", "data.train_on_prompt")
                yield ToggleField("Packing", "data.packing")
                yield InputField("Eval fraction", "data.eval_fraction", number=True)
                yield InputField("Max samples", "data.max_samples", number=True, placeholder="all")
            with Vertical(classes="side"):
                yield Label("One training example", classes="section-title")
                yield Static("", id="preview-format")
                with VerticalScroll(id="preview-box"):
                    yield Static("", id="preview")
                legend = Text()
                legend.append(" prompt, no loss ", MASKED_STYLE)
                legend.append("  ")
                legend.append(" learned ", LEARNED_STYLE)
                yield Static(legend, id="legend")

    def found_errors(self) -> list[str]:
        return [self.data_problem] if self.data_problem else []

    def sync(self) -> None:
        draft = self.app.draft
        key = tuple(draft.value(name) for name in PREVIEW_KEYS)
        changed = key != self.preview_key
        if changed:  # what the last example said about the data no longer holds
            self.preview_key, self.data_problem = key, None
        super().sync()
        if changed:
            self.query_one("#preview", Static).update(Text("loading an example…", style="italic"))
            self.preview_pending = True
            self.load_preview(key, draft.resolved)

    @work(thread=True, exclusive=True, group="preview")
    def load_preview(self, key: tuple, recipe) -> None:
        """The first training example exactly as the trainer tokenises and masks it, made in a child process
        (tuner.tui.preview): this thread only waits for it."""
        worker = get_current_worker()
        answer = self.previews.ask(recipe, lambda note: self.app.call_from_thread(self._loading, key, note),
                                   lambda: worker.is_cancelled)
        if answer is not None:
            self.post_message(PreviewLoaded(key, answer))

    def on_screen_suspend(self) -> None:
        """The step left: a preview still coming is unwanted (asked again on return), its process killed."""
        super().on_screen_suspend()
        self._drop_preview()

    def on_unmount(self) -> None:
        self._drop_preview()

    def _drop_preview(self) -> None:
        if self.preview_pending:
            self.preview_key = None
        self.workers.cancel_group(self, "preview")
        self.previews.stop()

    def _loading(self, key: tuple, what: str) -> None:
        if key == self.preview_key:
            self.query_one("#preview", Static).update(Text(what, style="italic"))

    def on_preview_loaded(self, message: PreviewLoaded) -> None:
        if message.key != self.preview_key:
            return  # an answer to an older question
        answer, preview = message.answer, self.query_one("#preview", Static)
        self.preview_pending, self.preview_pid = False, answer.pid
        if answer.error:
            preview.update(Text(f"no preview: {answer.error}", style="red"))
            self.query_one("#preview-format", Static).update("")
            if answer.error.startswith(DATA_FIELDS):  # the data and the recipe disagree: an error before launch
                self.data_problem = answer.error
                self.show_errors()
            return
        self.query_one("#preview-format", Static).update(f"format: {answer.data_format}")
        self.preview = preview_text(answer.segments)
        preview.update(self.preview)
