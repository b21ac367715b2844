"""Data: source and format, and one training example as the model sees it, the loss-free part shaded."""
from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, Static

from tuner.tui.output import LOG_NAME
from tuner.tui.screens.base import WizardScreen
from tuner.tui.widgets.fields import ChoiceField, InputField, ToggleField, schema_choices

MASKED_STYLE = "#8a8a8a on #303030"
LEARNED_STYLE = "bold #87d787"
DATA_FIELDS = ("data.", "objective.kind:")  # a data error naming one of these is the recipe's to fix
PREVIEW_KEYS = ("objective.kind", "data.source", "data.split", "data.format", "data.train_on_prompt",
                "data.max_samples", "training.seed", "training.max_seq_length", "model.id")


@dataclass
class PreviewLoaded(Message):
    """One formatted sample (segments of text and whether they earn loss), or why there is none."""

    key: tuple
    data_format: str = ""
    segments: list = None
    error: str | None = None


def preview_text(segments: list[tuple[str, bool]]) -> Text:
    text = Text()
    for part, trainable in segments:
        text.append(part, LEARNED_STYLE if trainable else MASKED_STYLE)
    return text


class DataScreen(WizardScreen):
    STEP = "data"

    def compose_body(self) -> ComposeResult:
        self.preview_key: tuple | None = None
        self.data_problem: str | None = None  # the data does not fit the recipe (an objective's layout, its columns)
        self.preview: Text | None = None  # the example as shown, styled per segment
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
            self.load_preview(key, draft.resolved)

    @work(thread=True, exclusive=True)
    def load_preview(self, key: tuple, recipe) -> None:
        """The first training example exactly as the trainer tokenises and masks it (datasets and
        transformers are heavy: off the UI thread)."""
        from tuner.build_once import is_built
        from tuner.catalog.demo import demo_model_dir, is_builtin
        from tuner.data.preview import preview_examples
        from tuner.doctor import check_model
        from tuner.loading.model import load_tokenizer

        model = check_model(recipe)
        if is_builtin(recipe.model.id) and not is_built(demo_model_dir(recipe.model.id)):  # once, a minute or less
            self.app.call_from_thread(self._loading, key, f"building the built-in model {recipe.model.id} (once; "
                                                          f"its output goes to {LOG_NAME} under TUNER_HOME)…")
        if model.status != "ok":  # never a download (or minutes of retries offline) behind "loading an example"
            self.post_message(PreviewLoaded(key, error=f"the preview reads the model's tokenizer from this machine: "
                                                       f"{model.detail} ({model.fix})"))
            return
        try:
            data_format, examples = preview_examples(recipe, load_tokenizer(recipe), count=1)
        except Exception as exc:  # any data or tokenizer problem is shown in place of the example
            self.post_message(PreviewLoaded(key, error=str(exc) or type(exc).__name__))
            return
        if not examples:
            self.post_message(PreviewLoaded(key, error="the training split is empty"))
            return
        self.post_message(PreviewLoaded(key, data_format, examples[0].segments))

    def _loading(self, key: tuple, what: str) -> None:
        if key == self.preview_key:
            self.query_one("#preview", Static).update(Text(what, style="italic"))

    def on_preview_loaded(self, message: PreviewLoaded) -> None:
        if message.key != self.preview_key:
            return  # an answer to an older question
        preview = self.query_one("#preview", Static)
        if message.error:
            preview.update(Text(f"no preview: {message.error}", style="red"))
            self.query_one("#preview-format", Static).update("")
            if message.error.startswith(DATA_FIELDS):  # the data and the recipe disagree: an error before launch
                self.data_problem = message.error
                self.show_errors()
            return
        self.query_one("#preview-format", Static).update(f"format: {message.data_format}")
        self.preview = preview_text(message.segments)
        preview.update(self.preview)
