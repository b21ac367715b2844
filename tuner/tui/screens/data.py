"""Data: source and format, and one training example as the model sees it, the loss-free part shaded."""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, Static

from tuner.tui.screens.base import WizardScreen
from tuner.tui.widgets.fields import ChoiceField, InputField, ToggleField, value_choices

MASKED_STYLE = "#8a8a8a on #303030"
LEARNED_STYLE = "bold #87d787"
PREVIEW_KEYS = ("data.source", "data.split", "data.format", "data.train_on_prompt", "model.id")


@dataclass
class PreviewLoaded(Message):
    """One formatted sample (segments of text and whether they earn loss), or why there is none."""

    key: tuple
    data_format: str = ""
    segments: list = None
    error: str | None = None


def preview_text(segments: list[tuple[str, bool]], train_on_prompt: bool) -> Text:
    text = Text()
    for part, trainable in segments:
        text.append(part, LEARNED_STYLE if trainable or train_on_prompt else MASKED_STYLE)
    return text


class DataScreen(WizardScreen):
    STEP = "data"

    def compose_body(self) -> ComposeResult:
        self.preview_key: tuple | None = None
        self.preview: Text | None = None  # the example as shown, styled per segment
        with Horizontal(classes="body"):
            with Vertical(classes="form"):
                yield InputField("Source", "data.source", placeholder="file.jsonl, cached dataset name or builtin:reverse")
                yield InputField("Split", "data.split")
                yield ChoiceField("Format", value_choices("data.format", ["auto", "text", "instruction", "chat"]),
                                  id="data-format")
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
                legend.append(" prompt: no loss ", MASKED_STYLE)
                legend.append("  ")
                legend.append(" completion: learned ", LEARNED_STYLE)
                yield Static(legend, id="legend")

    def sync(self) -> None:
        super().sync()
        draft = self.app.draft
        key = tuple(draft.value(name) for name in PREVIEW_KEYS)
        if key != self.preview_key:
            self.preview_key = key
            self.query_one("#preview", Static).update(Text("loading an example…", style="italic"))
            self.load_preview(key, draft.last_valid)

    @work(thread=True, exclusive=True)
    def load_preview(self, key: tuple, recipe) -> None:
        """Load one sample and the tokenizer off the UI thread (datasets and transformers are heavy)."""
        from tuner.data.formats import detect_format, sample_segments
        from tuner.data.sources import DataError, load_split
        from tuner.loading.model import ModelLoadError, load_tokenizer

        try:
            dataset = load_split(recipe.data.source, recipe.data.split)
            data_format = recipe.data.format
            if data_format == "auto":
                data_format = detect_format(dataset.column_names)
            tokenizer = load_tokenizer(recipe)
            segments = sample_segments(dataset[0], data_format, tokenizer)
        except (DataError, ModelLoadError, ValueError, KeyError, OSError) as exc:
            self.post_message(PreviewLoaded(key, error=str(exc)))
            return
        self.post_message(PreviewLoaded(key, data_format, segments))

    def on_preview_loaded(self, message: PreviewLoaded) -> None:
        if message.key != self.preview_key:
            return  # an answer to an older question
        preview = self.query_one("#preview", Static)
        if message.error:
            preview.update(Text(f"no preview: {message.error}", style="red"))
            self.query_one("#preview-format", Static).update("")
            return
        self.query_one("#preview-format", Static).update(f"format: {message.data_format}")
        self.preview = preview_text(message.segments, self.app.draft.value("data.train_on_prompt"))
        preview.update(self.preview)
