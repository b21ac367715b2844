"""Memory terms of distillation (distill) with TRL 1.16's GKDTrainer; each has a source in docs/memory.md.

- **The teacher's weights** ``[gkd-teacher]``: a frozen model beside the student on every rank, loaded as the
  student's base is (model.dtype; 4-bit under qlora, its other weights in model.dtype: the teacher is not k-bit
  prepared) and prepared by TRL: a stage-0 DeepSpeed engine under ZeRO-0/1/2 (``prepare_deepspeed``, which casts
  it to 16 bits under bf16/fp16), sharded under ZeRO-3 (the same, stage 3) and FSDP (Accelerate's
  ``prepare_model(evaluation_mode=True)``).
- **The logits and the divergence** ``[gkd-loss]``: GKD's ``compute_loss`` runs the student and the teacher on the
  whole sequence (full logits, no fused head) and ``generalized_jsd_loss`` on them: each of the two logits, their
  temperature-scaled copies and log-softmaxes, the divergence per entry and its gradient are b x s x V tensors.
  Traced (``tuner.loading.simulate``, ``benchmarks/distill_traces.py``): 8 of them live at the peak for a KL
  (beta 0 or 1), 16 for the Jensen-Shannon mixture (its stacked log-probabilities, logsumexp and two KL terms);
  an evaluation batch (no gradients) holds 8 and 11.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog.facts import ModelFacts
from tuner.planner.items import ALWAYS, EVAL, FORWARD_BACKWARD, NF4_BYTES, NF4_DOUBLE_QUANT_BYTES, Item

TEACHER = "teacher_model"  # the plan's category of the teacher's weights
# b x s x V tensors live at the peak of GKD's loss: (training step, evaluation batch), for a KL and for the mixture
LOGIT_TENSORS = {"kl": (8, 8), "jsd": (16, 11)}


@dataclass(frozen=True)
class Teacher:
    """What the plan needs of a distill recipe's teacher."""

    facts: ModelFacts
    divergence: str  # "kl" (beta 0: forward, 1: reverse) or "jsd" (the mixture in between)


def teacher_of(recipe) -> Teacher | None:
    """The teacher of a distill recipe (its facts as model.id's are read), else None."""
    objective = recipe.objective
    if objective.kind != "distill":
        return None
    from tuner.catalog.models import model_named_at

    facts = model_named_at("objective.teacher", objective.teacher, recipe.model.trust_remote_code)
    return Teacher(facts, "kl" if objective.distill.beta in (0.0, 1.0) else "jsd")


def teacher_items(s) -> tuple[list[Item], list[Item]]:
    """The teacher's weights on each rank's device and in host RAM (parameters offloaded under ZeRO-3)."""
    t = s.teacher.facts
    total = t.param_counts.total
    if s.quant_bits == 4:
        quantized = t.quantizable_params()
        per = NF4_DOUBLE_QUANT_BYTES if s.double_quant else NF4_BYTES
        weights, how = quantized * per + (total - quantized) * s.weight_bytes, "4-bit, as the student's base"
    else:
        weights, how = total * s.held_weight_bytes, f"{s.held_weight_bytes} bytes/param"
    shards = s.zero_ranks if s.distributed == "deepspeed" and s.zero == 3 else \
        s.shard_group if s.distributed == "fsdp" and s.fsdp != "no_shard" else 1
    label = f"teacher model (frozen, {how}" + (f", shard 1/{shards})" if shards > 1 else ")")
    item = Item(label, TEACHER, weights / shards, ALWAYS, "gkd-teacher")
    offloaded = s.distributed == "deepspeed" and s.zero == 3 and s.offload_params != "none"
    return ([], [item]) if offloaded else ([item], [])


def loss_items(s, tokens: int) -> list[Item]:
    """GKD's logits and divergence at the end of the forward, in place of SFT's logits and cross-entropy."""
    tensors = LOGIT_TENSORS[s.teacher.divergence][0]
    return [Item(f"student and teacher logits and GKD's divergence ({tensors} x s x b x V)", "logits_loss",
                 tensors * tokens * s.facts.vocab_size * s.act_bytes, FORWARD_BACKWARD, "gkd-loss")]


def eval_loss_items(s, tokens: int) -> list[Item]:
    """An evaluation batch's logits and divergence (GKD's compute_loss without gradients)."""
    tensors = LOGIT_TENSORS[s.teacher.divergence][1]
    return [Item(f"evaluation: student and teacher logits and GKD's divergence ({tensors} x s x b x V)",
                 "logits_loss", tensors * tokens * s.facts.vocab_size * s.act_bytes, EVAL, "gkd-loss")]
