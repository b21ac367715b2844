"""Training: learning rate, schedule, length, checkpoints, output directory and resume."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll

from tuner.recipe.schema import TrainingSection
from tuner.tui.draft import schema_values
from tuner.tui.screens.base import WizardScreen
from tuner.tui.widgets.fields import Choice, ChoiceField, InputField, schema_choices


class TrainingScreen(WizardScreen):
    STEP = "training"

    def compose_body(self) -> ComposeResult:
        with Horizontal(classes="body"):
            with VerticalScroll(classes="form", can_focus=False):  # scrolls on a short terminal
                yield InputField("Run name", "name")
                yield InputField("Learning rate", "training.learning_rate", number=True)
                yield ChoiceField("Schedule", schema_choices("training.lr_scheduler"), id="schedule")
                with Horizontal(classes="pair"):
                    yield InputField("Epochs", "training.epochs", number=True)
                    yield InputField("Max steps", "training.max_steps", number=True, placeholder="from epochs")
                with Horizontal(classes="pair"):
                    yield InputField("Warmup steps", "training.warmup_steps", number=True)
                    yield InputField("Log every", "training.logging_steps", number=True)
                with Horizontal(classes="pair"):
                    yield InputField("Save every", "training.save_steps", number=True, placeholder="end only")
                    yield InputField("Eval every", "training.eval_steps", number=True, placeholder="each epoch")
                yield InputField("Output directory", "output.dir", placeholder="runs/<name>")
                yield InputField("Resume", "training.resume", placeholder="never, auto or a checkpoint directory")
                yield ChoiceField("Tracker", [Choice("none", {"training.report_to": []}),
                                              *(Choice(name, {"training.report_to": [name]})
                                                                for name in schema_values("training.report_to"))],
                                  id="tracker", help=TrainingSection.model_fields["report_to"].description or "")
