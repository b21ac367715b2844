"""Method and memory tactics, beside the live memory plan; Auto-fit applies the advisor's cheapest fit."""
from __future__ import annotations

from dataclasses import dataclass

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Label, OptionList
from textual.widgets.option_list import Option

from tuner.recipe.schema import MemorySection
from tuner.tui.messages import PlanUpdated
from tuner.tui.planning import Proposal
from tuner.tui.screens.base import WizardScreen
from tuner.tui.widgets.fields import Choice, ChoiceField, InputField, ToggleField, value_choices
from tuner.tui.widgets.plan_bar import PlanPanel

METHODS = [
    Choice("Full", {"method.kind": "full", "method.quantization": None}),
    Choice("LoRA", {"method.kind": "lora", "method.quantization": None}),
    Choice("QLoRA 4-bit", {"method.kind": "qlora", "method.quantization": {"bits": 4}}),
]
DISTRIBUTION = [
    Choice("Single", {"memory.distributed": "none", "memory.zero_stage": None}),
    Choice("DDP", {"memory.distributed": "ddp", "memory.zero_stage": None}),
    *[Choice(f"ZeRO-{stage}", {"memory.distributed": "deepspeed", "memory.zero_stage": stage}) for stage in (1, 2, 3)],
    Choice("FSDP", {"memory.distributed": "fsdp", "memory.zero_stage": None}),
]

OPTIMIZERS = [
    Choice(label, {"memory.optimizer": value}) for label, value in (
        ("AdamW", "adamw_torch"), ("fused", "adamw_torch_fused"), ("8-bit", "adamw_8bit"),
        ("paged 8-bit", "paged_adamw_8bit"), ("paged 32-bit", "paged_adamw_32bit"))
]


def _help(field: str) -> str:
    return MemorySection.model_fields[field].description or ""


@dataclass
class AdviceArrived(Message):
    """The advisor answered Auto-fit: ranked proposals, best first."""

    proposals: list[Proposal]
    error: str | None = None


class MethodScreen(WizardScreen):
    STEP = "method"
    BINDINGS = [Binding("f", "autofit", "Auto-fit", id="autofit", tooltip="Apply the cheapest plan that fits")]

    def compose_body(self) -> ComposeResult:
        self.proposals: list[Proposal] = []
        with Horizontal(classes="body"):
            with VerticalScroll(classes="form", id="method-form"):
                yield ChoiceField("Method", METHODS, id="method-kind",
                                  help="full trains every weight; LoRA trains adapters; QLoRA adapters on a 4-bit base")
                with Horizontal(classes="pair"):
                    yield InputField("LoRA rank", "method.lora.r", number=True)
                    yield InputField("LoRA alpha", "method.lora.alpha", number=True)
                yield ChoiceField("Distribution", DISTRIBUTION, id="distribution", help=_help("distributed"))
                yield ChoiceField("Offload optimizer", value_choices("memory.offload_optimizer", ["none", "cpu", "nvme"]),
                                  id="offload-optimizer", help=_help("offload_optimizer"))
                yield ChoiceField("Offload parameters", value_choices("memory.offload_params", ["none", "cpu", "nvme"]),
                                  id="offload-params", help=_help("offload_params"))
                yield ToggleField("Gradient checkpointing", "memory.gradient_checkpointing",
                                  help=_help("gradient_checkpointing"))
                yield ChoiceField("Attention", value_choices("memory.attention", ["auto", "flash", "sdpa", "eager"]),
                                  id="attention", help=_help("attention"))
                yield ChoiceField("Precision", value_choices("memory.mixed_precision", ["bf16", "fp16", "no"]),
                                  id="precision", help=_help("mixed_precision"))
                yield ChoiceField("Optimizer", OPTIMIZERS, id="optimizer", help=_help("optimizer"))
                with Horizontal(classes="pair"):
                    yield InputField("Micro-batch", "memory.micro_batch_size", number=True)
                    yield InputField("Grad. accum.", "memory.gradient_accumulation_steps", number=True)
                yield InputField("Sequence length", "memory.max_seq_length", number=True)
            with Vertical(classes="side", id="plan-side"):
                yield Label("Memory plan", classes="section-title")
                yield PlanPanel(id="plan")
                yield Button("Auto-fit (f)", id="autofit", variant="primary")
                yield OptionList(id="alternatives")

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#alternatives", OptionList).display = False
        self.query_one("#method-kind").query_one("RadioSet").focus()

    def sync(self) -> None:
        super().sync()
        panel = self.query_one(PlanPanel)
        panel.plan = self.app.plan
        panel.status = self.app.plan_status
        self.query_one("#autofit", Button).disabled = not (self.app.planner.available and self.app.draft.valid)

    def on_plan_updated(self, message: PlanUpdated) -> None:
        panel = self.query_one(PlanPanel)
        panel.plan = message.plan
        panel.status = self.app.plan_status

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "autofit":
            self.action_autofit()

    def action_autofit(self) -> None:
        recipe = self.app.draft.recipe
        if recipe is None or not self.app.planner.available:
            self.notify("Auto-fit needs a valid recipe and the planner.", severity="warning")
            return
        self.query_one("#autofit", Button).label = "Auto-fit: thinking…"
        self.advise(recipe)

    @work(thread=True, exclusive=True)
    def advise(self, recipe) -> None:
        try:
            self.post_message(AdviceArrived(self.app.planner.advise(recipe)))
        except Exception as exc:  # the advisor's failure is shown, never a crashed UI
            self.post_message(AdviceArrived([], error=f"{type(exc).__name__}: {exc}"))

    def on_advice_arrived(self, message: AdviceArrived) -> None:
        self.query_one("#autofit", Button).label = "Auto-fit (f)"
        if message.error:
            self.notify(f"advisor failed: {message.error}", severity="error")
            return
        self.proposals = message.proposals
        fitting = [proposal for proposal in self.proposals if proposal.fits]
        listing = self.query_one("#alternatives", OptionList)
        listing.clear_options()
        for index, proposal in enumerate(self.proposals):
            listing.add_option(Option(f"{index + 1}. {proposal.summary}", id=str(index)))
        listing.display = bool(self.proposals)
        if not fitting:
            self.notify("No plan fits this hardware; see the alternatives.", severity="warning")
            return
        self.app.draft.replace(fitting[0].recipe)
        self.app.draft_changed()
        self.notify("Applied the cheapest plan that fits.")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option_list.id == "alternatives":
            self.app.draft.replace(self.proposals[int(event.option.id)].recipe)
            self.app.draft_changed()
