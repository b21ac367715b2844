"""What the Method step offers: each box's choices, as the changes to the draft that choosing one makes.

Each list follows the schema (its ``Literal`` values, in order), so the screen cannot offer fewer values than the
recipe accepts; choices that depend on the draft's model (a teacher, LoRA's targets) say where they are offered.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog.teachers import known_models, teacher_candidates
from tuner.tui.draft import Changes, Draft, schema_values
from tuner.tui.widgets.fields import Choice, ObjectiveChoice, schema_choices, schema_labels

# every value of the schema's Literal, in its order (labels for other values than the schema's fail at import)
METHOD_LABELS = {"full": "Full", "lora": "LoRA", "qlora": "QLoRA 4-bit"}
METHODS = [Choice(label, {"method.kind": kind, "method.quantization": {"bits": 4} if kind == "qlora" else None})
           for kind, label in schema_labels("method.kind", METHOD_LABELS).items()]
DISTRIBUTED_LABELS = {"none": "Single", "ddp": "DDP", "deepspeed": "ZeRO-{stage}", "fsdp": "FSDP"}
DISTRIBUTION = [  # deepspeed: one choice per ZeRO stage
    choice for kind, label in schema_labels("memory.distributed", DISTRIBUTED_LABELS).items() for choice in (
        [Choice(label.format(stage=stage), {"memory.distributed": kind, "memory.zero_stage": stage})
         for stage in schema_values("memory.zero_stage")] if kind == "deepspeed"
        else [Choice(label, {"memory.distributed": kind, "memory.zero_stage": None})])
]

# every objective of the schema; sft, dpo and kto drop grpo's section; grpo starts with one group (its default 8
# generations) per micro-batch, scored by exact match; reward also drops the beta and loss of dpo, kto and grpo;
# every objective but distill drops its teacher
DISTILL_FIELDS = {"objective.teacher": None, "objective.distill": None}
EXACT_MATCH = {"kind": "exact_match", "column": "answer"}
OBJECTIVE_CHANGES = {"grpo": {"objective.grpo": {"rewards": [EXACT_MATCH]}, "training.micro_batch_size": 8},
                     "reward": {"objective.grpo": None, "objective.beta": None, "objective.loss_type": None}}


@dataclass(frozen=True)
class TeacherChoice(Choice):
    """A teacher for distill, offered where it shares the draft's model's tokenizer and is larger."""

    def offered_in(self, draft: Draft) -> bool:
        model = draft.resolved.model
        return self.changes["objective.teacher"] in teacher_candidates(model.id, model.revision)


@dataclass(frozen=True)
class TeacherObjectiveChoice(ObjectiveChoice):
    """distill: starts with the nearest larger model tuner knows that can teach the draft's model (else the model
    itself, which the Teacher box then replaces), unless the draft names a teacher already."""

    def changes_for(self, draft: Draft) -> Changes:
        model = draft.resolved.model
        teacher = draft.value("objective.teacher") or next(iter(teacher_candidates(model.id, model.revision)),
                                                            model.id)
        return {**super().changes_for(draft), "objective.teacher": teacher, "objective.distill": None}


OBJECTIVES = [(TeacherObjectiveChoice if kind == "distill" else ObjectiveChoice)(
    kind, {"objective.kind": kind, **OBJECTIVE_CHANGES.get(kind, {"objective.grpo": None}), **DISTILL_FIELDS})
    for kind in schema_values("objective.kind")]
# distill's teacher: each model tuner knows, offered where it can teach the draft's model (tuner.catalog.teachers)
TEACHERS = [TeacherChoice(model_id, {"objective.teacher": model_id}) for model_id in known_models()]
REWARDS = [
    Choice("exact match (answer)", {"objective.grpo.rewards": [EXACT_MATCH]}),
    Choice("regex match (<answer>)", {"objective.grpo.rewards": [
        {"kind": "regex_match", "column": "answer", "pattern": "<answer>(.*?)</answer>"}]}),
    Choice("exact match + length", {"objective.grpo.rewards": [EXACT_MATCH, {"kind": "length", "weight": 0.1}]}),
]

@dataclass(frozen=True)
class TargetChoice(Choice):
    """What LoRA adapts, in the names of the draft's model (its facts, as the recipe checker reads them): every linear
    layer (the schema's ``all-linear``: a MoE model's fused experts too, which PEFT adapts only without dropout), the
    attention's, or the attention's and, for a MoE model, its fused experts as parameters (PEFT's
    target_parameters).  Unset fields stay the schema's default, so all-linear is chosen by saying nothing."""

    targets: str = "all-linear"  # all-linear, attention or experts

    def _names(self, draft: Draft) -> tuple[list[str], list[str]] | None:
        """(the attention's linear layers, the experts' parameters) of the model, or None when it is unknown."""
        from tuner.catalog.model_config import UnknownModelError
        from tuner.catalog.models import model_facts

        model = draft.resolved.model
        try:
            facts = model_facts(model.id, model.revision, model.trust_remote_code)
        except UnknownModelError:  # the hub's too (HubError): the Model step says why
            return None
        kind = max(facts.layer_kinds, key=lambda kind: kind.count)
        mixer = f"{kind.dims.get('mixer_path', 'self_attn')}."
        attention = list(dict.fromkeys(lin.name.rsplit(".", 1)[-1] for lin in kind.linears
                                       if lin.is_nn_linear and lin.name.startswith(mixer)))
        experts = [lin.name for lin in kind.linears if not lin.is_nn_linear and ".experts." in f".{lin.name}."]
        return attention, experts

    def changes_for(self, draft: Draft) -> Changes:
        names = self._names(draft) if self.targets != "all-linear" else None
        if names is None:
            return LORA_TARGET_FIELDS
        attention, experts = names
        return {"method.lora.target_modules": attention,
                "method.lora.target_parameters": experts if self.targets == "experts" else None}

    def chosen_in(self, draft: Draft) -> bool:
        resolved = {"method.lora.target_modules": "all-linear", "method.lora.target_parameters": []}
        wanted = {field: resolved[field] if value is None else value
                  for field, value in self.changes_for(draft).items()}
        return draft.holds(wanted)

    def offered_in(self, draft: Draft) -> bool:
        if self.targets == "all-linear":
            return True
        names = self._names(draft)
        return names is not None and bool(names[0]) and (self.targets == "attention" or bool(names[1]))


LORA_TARGET_FIELDS = {"method.lora.target_modules": None, "method.lora.target_parameters": None}
LORA_TARGETS = [TargetChoice(label, LORA_TARGET_FIELDS, targets) for targets, label in (
    ("all-linear", "all linear"), ("attention", "attention"), ("experts", "attention + experts"))]
assert schema_values("method.lora.target_modules") == ("all-linear",)  # the schema's one named value, offered first

@dataclass(frozen=True)
class WrittenChoice(Choice):
    """An option chosen by what the recipe sets (``auto``), not by what other fields resolve the field to."""

    def chosen_in(self, draft: Draft) -> bool:
        return all(draft.written(field) == value for field, value in self.changes.items())


PARALLEL_DEGREES = [1, 2, 4, 8]  # ranks splitting one layer (tp), one sequence (cp, sp) or the experts (ep); a refused
# one says why (tuner validate's message: ep needs fsdp, a MoE model with a base_model_ep_plan, ...)

OPTIMIZERS = schema_choices("training.optimizer", {
    "adamw_torch": "AdamW", "adamw_torch_fused": "fused", "adamw_8bit": "8-bit", "paged_adamw_8bit": "paged 8-bit",
    "paged_adamw_32bit": "paged 32-bit"})
