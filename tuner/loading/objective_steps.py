"""One training step of each objective beside plain causal-LM loss, as TRL's trainers compute it, for
:mod:`tuner.loading.simulate` to trace on fake tensors: dpo/kto's policy and reference, the reward model's pair
margin, GKD's student and frozen teacher.  Each is the tensors of the trainer's own loss, not an estimate."""
from __future__ import annotations


def prepare_like_trl(model, reference, kind: str) -> None:
    """What TRL's DPOTrainer/KTOTrainer do to the models before training: dropout off, fused LM heads."""
    from peft import PeftModel
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    outputs = ("log_probs", "entropy", "mean_logits") + (("is_top1",) if kind == "dpo" else ())
    disable_dropout_in_model(model)
    add_fused_lm_head(model.get_base_model() if isinstance(model, PeftModel) else model, outputs=outputs)
    if reference is not None:
        disable_dropout_in_model(reference)
        add_fused_lm_head(reference)


def preference_step(policy, reference, recipe):
    """One root module whose forward is the preference loss: the tracker refuses a root module called twice in a
    step (the LoRA reference is the policy with its adapter disabled), and it counts the reference's weights."""
    import torch

    class PreferenceStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.policy = policy
            self.reference = reference

        def forward(self, ids):
            return _preference_loss(self.policy, self.reference, ids, recipe)

    return PreferenceStep()


def _preference_loss(model, reference, ids, recipe):
    """The tensors of TRL's ``_compute_loss`` for dpo (sigmoid) and kto: policy, reference, loss on sequence sums."""
    import contextlib

    import torch
    import torch.nn.functional as F

    beta = recipe.objective.beta
    labels = ids.clone()
    labels[:, : ids.shape[1] // 4] = -100  # the prompt is masked; the CPU head scores every position anyway
    policy = model(input_ids=ids, labels=labels, fused_lm_head=True, use_cache=False)
    logps = policy.log_probs.sum(dim=1)
    if recipe.objective.precompute_ref_log_probs:
        ref_logps = torch.zeros_like(logps)
    else:
        disabled = model.disable_adapter() if reference is None else contextlib.nullcontext()
        with torch.no_grad(), disabled:
            ref_logps = (reference or model)(input_ids=ids, labels=labels, fused_lm_head=True,
                                             use_cache=False).log_probs.sum(dim=1)
    ratios = logps - ref_logps
    if recipe.objective.kind == "dpo":
        chosen, rejected = ratios.chunk(2, dim=0)
        return -F.logsigmoid(beta * (chosen - rejected)).mean()
    return (1 - torch.sigmoid(beta * ratios)).mean()  # kto's desirable loss (its KL term needs no gradient)


def reward_step(model):
    """The loss of TRL's RewardTrainer on a micro-batch of chosen then rejected sequences: one score each (the head
    reads the last token before padding), ``-log sigmoid(chosen - rejected)``."""
    import torch
    import torch.nn.functional as F

    from trl.trainer.utils import disable_dropout_in_model

    disable_dropout_in_model(model)
    text = model.config.get_text_config()  # an image-text model's text config holds the id, as TRL sets it
    if getattr(text, "pad_token_id", None) is None:  # the head finds each sequence's end by its padding
        text.pad_token_id = 0

    def loss(ids):
        chosen, rejected = model(input_ids=ids, use_cache=False).logits.squeeze(-1).chunk(2)
        return -F.logsigmoid(chosen - rejected).mean()

    return loss


def teacher_recipe(recipe):
    """The recipe that builds a distill recipe's teacher: its model, without adapters, in the student's dtype and
    attention (qlora is never simulated: bitsandbytes' kernels)."""
    from tuner.recipe.io import validate_recipe

    data = recipe.model_dump(mode="json")
    data["model"]["id"], data["model"]["revision"] = recipe.objective.teacher, None
    data["objective"] = {"kind": "sft"}
    data["method"] = {"kind": "full"}
    data["output"]["save"] = "full"
    return validate_recipe(data)


def distill_step(student, teacher, recipe):
    """One root module whose forward is GKD's loss (TRL's ``GKDTrainer.compute_loss``): the student's logits, the
    frozen teacher's under ``no_grad``, the generalised Jensen-Shannon divergence on the shifted positions."""
    import torch

    from tuner.loading.teacher import gkd

    jsd = gkd().GKDTrainer.generalized_jsd_loss
    beta = recipe.objective.distill.beta

    class DistillStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.student, self.teacher = student, teacher

        def forward(self, ids):
            student_logits = self.student(input_ids=ids, use_cache=False).logits
            with torch.no_grad():
                teacher_logits = self.teacher(input_ids=ids, use_cache=False).logits
            per_entry = jsd(student_logits[:, :-1, :], teacher_logits[:, :-1, :], beta=beta, reduction="none")
            # TRL's ``jsd[labels != -100]`` (the prompt's first quarter masked), as the same rows selected by index:
            # a boolean mask's nonzero has a shape fake tensors cannot know
            batch, positions, vocab = per_entry.shape
            kept = torch.arange(batch * positions).reshape(batch, positions)[:, ids.shape[1] // 4:].flatten()
            return per_entry.reshape(-1, vocab).index_select(0, kept).sum() / kept.numel()

    return DistillStep()
