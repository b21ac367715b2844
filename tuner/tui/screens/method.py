"""Method and memory tactics, beside the live memory plan; Auto-fit lists the advisor's plans as changes.

Auto-fit never edits on its own: each proposal is shown as the fields it would change (never the
model or the hardware); Enter applies exactly those.  The list follows the draft: recomputed after
every change, cleared for a new recipe or another model.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from tuner.planner import Advice
from tuner.planner.advisor import change_label
from tuner.recipe.compute import FsdpSection, MemorySection, ParallelismSection
from tuner.recipe.objective import PREFERENCE_OBJECTIVES, TRL_LOSS_TYPES, GrpoSection, ObjectiveSection
from tuner.recipe.schema import LoraSection, MethodSection, ModelSection, Recipe, TrainingSection
from tuner.tui.draft import Changes
from tuner.tui.messages import DiskChecked, PlanUpdated
from tuner.tui.planning import CannotPlan, worth_showing
from tuner.tui.screens.base import WizardScreen
from tuner.tui.screens.method_choices import (DISTRIBUTION, LORA_TARGETS, METHODS, OBJECTIVES, OPTIMIZERS,
                                              PARALLEL_DEGREES, REWARDS, TEACHERS, WrittenChoice)
from tuner.tui.widgets.fields import ChoiceField, InputField, ToggleField, schema_choices, value_choices
from tuner.tui.widgets.lists import PickList
from tuner.tui.widgets.plan_bar import PlanPanel, PlanView, Verdict
from tuner.tui.widgets.proposal import Proposal


def _help(section, field: str) -> str:
    return section.model_fields[field].description or ""


@dataclass(frozen=True)
class Alternative:
    """An advisor's plan as this draft's changes (what Enter applies)."""

    advice: Advice
    changes: Changes


@dataclass
class AdviceArrived(Message):
    """The advisor answered for ``starts`` (see MethodScreen._starts): its plans, or why it could not."""

    starts: list[Recipe]
    advice: list[Advice]
    error: str | None = None


class MethodScreen(WizardScreen):
    STEP = "method"
    BINDINGS = [Binding("f", "autofit", "Auto-fit", id="autofit",
                        tooltip="List the cheapest plans that fit, as changes to this recipe")]

    def compose_body(self) -> ComposeResult:
        self.alternatives: list[Alternative] = []
        self.advised: tuple | None = None  # (draft, model id) the list was made for; None: no list shown
        self.advised_starts: list[Recipe] | None = None
        with Horizontal(classes="body"):
            with VerticalScroll(classes="form", id="method-form", can_focus=False):  # tab goes to the fields
                yield ChoiceField("Method", METHODS, id="method-kind", help=_help(MethodSection, "kind"))
                with Horizontal(classes="pair"):
                    yield InputField("LoRA rank", "method.lora.r", number=True)
                    yield InputField("LoRA alpha", "method.lora.alpha", number=True)
                yield InputField("LoRA dropout", "method.lora.dropout", number=True,
                                 help=_help(LoraSection, "dropout"))
                yield ChoiceField("LoRA targets", LORA_TARGETS, id="lora-targets",
                                  help=_help(LoraSection, "target_modules"))
                yield ToggleField("Auto-fit may switch to LoRA / QLoRA", "method.allow_method_change",
                                  help=_help(MethodSection, "allow_method_change"))
                yield ChoiceField("Objective", OBJECTIVES, id="objective-kind", help=_help(ObjectiveSection, "kind"))
                with Horizontal(classes="pair", id="preference"):  # shown for dpo, kto and grpo
                    yield InputField("Beta", "objective.beta", number=True)
                    yield ToggleField("Precompute reference", "objective.precompute_ref_log_probs",
                                      help=_help(ObjectiveSection, "precompute_ref_log_probs"))
                with Horizontal(classes="pair", id="grpo"):  # shown for grpo
                    yield InputField("Generations", "objective.grpo.num_generations", number=True)
                    yield InputField("Completion tokens", "objective.grpo.max_completion_length", number=True)
                yield ChoiceField("Reward", REWARDS, id="grpo-rewards", help=_help(GrpoSection, "rewards"))
                yield ChoiceField("Teacher", TEACHERS, id="distill-teacher", help=_help(ObjectiveSection, "teacher"))
                yield InputField("Teacher model", "objective.teacher", apply_on_enter=True,
                                 placeholder="a folder or hub id sharing the model's tokenizer",
                                 help=_help(ObjectiveSection, "teacher"))
                yield ChoiceField("Distribution", DISTRIBUTION, id="distribution",
                                  help=_help(MemorySection, "distributed"))
                yield ChoiceField("FSDP sharding", schema_choices("memory.fsdp.sharding_strategy"),
                                  id="fsdp-sharding", help=_help(FsdpSection, "sharding_strategy"))
                for degree, label in (("tp", "Tensor parallel"), ("cp", "Context parallel"), ("sp", "Sequence parallel"),
                                      ("ep", "Expert parallel")):
                    yield ChoiceField(f"{label} ({degree})", value_choices(f"parallelism.{degree}", PARALLEL_DEGREES),
                                      id=f"parallelism-{degree}", help=_help(ParallelismSection, degree))
                yield ChoiceField("Offload optimizer", schema_choices("memory.offload_optimizer"),
                                  id="offload-optimizer", help=_help(MemorySection, "offload_optimizer"))
                yield ChoiceField("Offload parameters", schema_choices("memory.offload_params"),
                                  id="offload-params", help=_help(MemorySection, "offload_params"))
                yield ToggleField("Gradient checkpointing", "memory.gradient_checkpointing",
                                  help=_help(MemorySection, "gradient_checkpointing"))
                yield ToggleField("Activation offloading (CPU RAM)", "memory.activation_offloading",
                                  help=_help(MemorySection, "activation_offloading"))
                yield ToggleField("Chunked loss (no full logits)", "memory.chunked_loss",
                                  help=_help(MemorySection, "chunked_loss"))
                yield ChoiceField("Attention", schema_choices("memory.attention"),
                                  id="attention", help=_help(MemorySection, "attention"))
                yield ChoiceField("Precision", schema_choices("memory.mixed_precision"),
                                  id="precision", help=_help(MemorySection, "mixed_precision"))
                yield ChoiceField("Weights (loaded as)", schema_choices("model.dtype", choice=WrittenChoice),
                                  id="model-dtype", help=_help(ModelSection, "dtype"))
                yield ChoiceField("Optimizer", OPTIMIZERS, id="optimizer", help=_help(TrainingSection, "optimizer"))
                with Horizontal(classes="pair"):
                    yield InputField("Micro-batch", "training.micro_batch_size", number=True)
                    yield InputField("Grad. accum.", "training.gradient_accumulation_steps", number=True)
                yield InputField("Sequence length", "training.max_seq_length", number=True)
            with Vertical(classes="side", id="plan-column"):  # the verdict pinned above what scrolls
                yield Label("Memory plan", classes="section-title")
                yield Verdict(id="verdict")
                with VerticalScroll(id="plan-side"):
                    yield PlanPanel(verdict=False, id="plan")
                    yield Button("Auto-fit (f)", id="autofit", variant="primary", compact=True)
                    yield PickList(id="alternatives")
                    yield Proposal("", id="proposal")

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#method-kind").query_one("RadioSet").focus(scroll_visible=False)
        form = self.query_one("#method-form", VerticalScroll)
        self.call_after_refresh(form.scroll_home, animate=False)  # the radio set scrolls its choice in: keep the label

    def sync(self) -> None:
        super().sync()
        app = self.app
        for view in self.query(PlanView):
            view.show(app)
        self.query_one("#autofit", Button).disabled = bool(app.draft.invalid)
        self.query_one("#fsdp-sharding").display = app.draft.value("memory.distributed") == "fsdp"
        kind = app.draft.value("objective.kind")
        self.query_one("#preference").display = kind in TRL_LOSS_TYPES  # beta: dpo, kto and grpo
        self.query_one("#objective-precompute_ref_log_probs").display = kind in PREFERENCE_OBJECTIVES
        self.query_one("#grpo").display = self.query_one("#grpo-rewards").display = kind == "grpo"
        for teacher in ("#distill-teacher", "#objective-teacher"):
            self.query_one(teacher).display = kind == "distill"
        self._follow_draft()

    def on_plan_updated(self, message: PlanUpdated) -> None:
        for view in self.query(PlanView):
            view.show(self.app)

    def on_disk_checked(self, message: DiskChecked) -> None:
        for view in self.query(PlanView):
            view.disk = message.check

    # --- Auto-fit -------------------------------------------------------------------------------
    def _starts(self) -> list[Recipe]:
        """The recipes Auto-fit asks the advisor about: the draft's own, or, while it has errors that one choice on
        this screen fixes (eight GPUs and no distribution), the draft with each such fix; none while a box holds a
        refused value (only the user knows what they meant)."""
        draft = self.app.draft
        if draft.invalid:
            return []
        if draft.plannable is not None:
            return [draft.plannable]
        starts: list[Recipe] = []
        for field in self.query(ChoiceField):
            for choice in field.choices:
                recipe = None if choice.chosen_in(draft) else draft.fixed_by(choice.changes_for(draft))
                if recipe is not None and recipe not in starts:
                    starts.append(recipe)
        return starts

    def _follow_draft(self) -> None:
        """Keep the list true to the draft: gone for a new recipe or model, recomputed after any other change."""
        if self.advised is None:
            return
        draft = self.app.draft
        starts = self._starts() if self.advised == (draft, draft.value("model.id")) else []
        if not starts:
            self._clear_advice()
        elif starts != self.advised_starts:
            self._ask(starts)

    def _clear_advice(self) -> None:
        self.advised, self.advised_starts, self.alternatives = None, None, []
        listing = self.query_one("#alternatives", PickList)
        listing.clear_options()
        listing.display = False
        self.query_one("#proposal", Static).update("")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "autofit":
            self.action_autofit()

    def action_autofit(self) -> None:
        starts = self._starts()
        if not starts:
            draft = self.app.draft
            why = ("fix the marked boxes first" if draft.invalid else
                   "no choice on this screen fixes the errors; fix them first")
            self.notify(f"Auto-fit: {why}.", severity="warning")
            return
        self._ask(starts)
        listing = self.query_one("#alternatives", PickList)
        listing.display = True
        listing.focus()

    def _ask(self, starts: list[Recipe]) -> None:
        draft = self.app.draft
        self.advised, self.advised_starts = (draft, draft.value("model.id")), starts
        self.query_one("#autofit", Button).label = "Auto-fit: thinking…"
        self.advise(starts)

    @work(thread=True, exclusive=True, group="advice")
    def advise(self, starts: list[Recipe]) -> None:
        """The advisor's plans, on this machine's RAM where the recipe gives none (as the Hardware step shows it)."""
        from tuner.tui.detect import machine_ram_gib

        ram = machine_ram_gib() if self.app.detect_hardware else None
        advice = []
        try:
            for recipe in starts:
                advice += self.app.planner.advise(recipe, host_ram_gib=ram)
        except CannotPlan as exc:
            self.post_message(AdviceArrived(starts, [], error=str(exc)))
            return
        self.post_message(AdviceArrived(starts, advice))

    def on_advice_arrived(self, message: AdviceArrived) -> None:
        if self.advised is None or message.starts != self.advised_starts:
            return  # an answer about an earlier draft
        self.query_one("#autofit", Button).label = "Auto-fit (f)"
        listing = self.query_one("#alternatives", PickList)
        listing.clear_options()
        listing.display = True
        if message.error:
            self.alternatives = []
            self.query_one("#proposal", Static).update(Text(f"Auto-fit cannot plan this recipe: {message.error}"))
            return
        draft = self.app.draft
        ranked = sorted(worth_showing(message.advice), key=lambda advice: (not advice.fits, advice.cost))
        if any(advice.fits for advice in ranked):
            ranked = [advice for advice in ranked if advice.fits]
        else:
            ranked = ranked[:1]  # what is missing, once
        self.alternatives, seen = [], []
        for advice in ranked:
            changes = draft.changes_towards(advice.recipe) if advice.fits else {}
            if advice.fits and changes in seen:
                continue
            seen.append(changes)
            advice = replace(advice, label=change_label(draft.resolved, advice.recipe))  # what Enter applies here
            self.alternatives.append(Alternative(advice, changes))
            number = f"{len(self.alternatives)}. "
            prompt = number + (advice.summary() if advice.fits else f"nothing fits: {advice.summary()}")
            listing.add_option(Option(prompt, id=str(len(self.alternatives) - 1), disabled=not advice.fits))
        listing.highlight_first()
        self._show_alternative(listing.highlighted)
        self.call_after_refresh(self._reveal)

    def _reveal(self) -> None:
        """Bring the list and the changes under it into view (a short terminal scrolls the side panel; the verdict
        is pinned above it)."""
        listing = self.query_one("#alternatives", PickList)
        if listing.has_focus:  # the list at the top, as many of the changes below it as fit
            listing.scroll_visible(top=True, animate=False)  # after the refresh that lays the new options out

    def _show_alternative(self, index: int | None) -> None:
        box = self.query_one("#proposal", Proposal)
        if index is None:
            none_fit = self.alternatives and not any(p.advice.fits for p in self.alternatives)
            box.update("Nothing to apply: no plan fits; the entry above says what to add or change." if none_fit else "")
            return
        proposal = self.alternatives[index]
        if not proposal.changes:
            box.update(Text("This is the recipe as it is now.", style="italic"))
            return
        box.show_changes("Enter applies these changes:", self.app.draft.describe_changes(proposal.changes))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_list.id == "alternatives":
            self._show_alternative(event.option_index)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option_list.id != "alternatives" or event.option.disabled:
            return
        proposal = self.alternatives[int(event.option.id)]
        if not proposal.changes:
            self.notify("Already the recipe as it is.")
            return
        self.app.draft.apply(proposal.changes)
        self.app.draft_changed()
        self.notify(f"Applied {len(proposal.changes)} change(s): {', '.join(proposal.changes)}")
