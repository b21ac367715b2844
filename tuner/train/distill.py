"""Distillation (distill) with TRL's GKDTrainer: the config, the student, the frozen teacher, the data.

The data is tokenised as SFT tokenises it (:func:`tuner.data.prepared.prepare_data`), so the student is asked the
way every other tuner model is; GKD's ChatML collator is replaced by SFT's padding collator plus each sample's
prompt, left-padded, which GKD's on-policy steps sample from.  Off-policy steps (``on_policy`` 0) score the data's
own completions with the teacher; on-policy steps score the student's samples.  The teacher loads as the student's
base does (model.dtype; 4-bit under qlora) and is prepared by TRL on the same devices, sharded under ZeRO-3 (its
``prepare_deepspeed``) or FSDP (Accelerate's ``prepare_model``).
"""
from __future__ import annotations

import logging

from tuner.data.formats import IGNORE_INDEX
from tuner.data.prepare import PreparedData
from tuner.loading.teacher import gkd, load_teacher
from tuner.recipe.schema import Recipe

log = logging.getLogger("tuner")


def distill_arguments(recipe: Recipe) -> tuple[type, dict]:
    """GKDConfig and the objective's settings from the recipe (the rest come from training_arguments)."""
    distill = recipe.objective.distill
    return gkd().GKDConfig, dict(
        lmbda=distill.on_policy, beta=distill.beta, temperature=distill.temperature,
        max_new_tokens=distill.max_new_tokens, seq_kd=distill.sequence_level,
        max_length=recipe.training.max_seq_length, disable_dropout=True,
        dataset_kwargs={"skip_prepare_dataset": True},  # tokenised here, as SFT is
        eval_on_start=recipe.data.eval_fraction > 0)  # the held-out divergence before training


class PromptCollator:
    """SFT's collator, plus GKD's ``prompts`` and ``prompt_attention_mask``: each sample's tokens before its first
    trained label, left-padded (generation continues every prompt from its last token)."""

    def __init__(self, collator, pad_token_id: int):
        self.collator, self.pad_token_id = collator, pad_token_id

    def __call__(self, features: list[dict]) -> dict:
        import torch

        prompts = []
        for feature in features:
            labels = list(feature["labels"])
            start = next((index for index, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))
            prompts.append(list(feature["input_ids"][:max(start, 1)]))
        batch = self.collator(features)
        width = max(len(prompt) for prompt in prompts)
        batch["prompts"] = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p in prompts])
        batch["prompt_attention_mask"] = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        return batch


def distill_trainer(recipe: Recipe, args, tokenizer, callbacks, model_path: str | None = None
                    ) -> tuple[object, PreparedData]:
    """TRL's GKDTrainer for the recipe (the student from ``model_path`` when given), and what became of its data."""
    from tuner.data.prepare import data_collator
    from tuner.data.prepared import prepare_data
    from tuner.loading.model import count_parameters
    from tuner.train.preference import trl_policy

    data = prepare_data(recipe, tokenizer)
    distill = recipe.objective.distill
    log.info("data: %d training and %d held-out %s samples; teacher %s; %s", len(data.train),
             len(data.eval) if data.eval is not None else 0, data.data_format, recipe.objective.teacher,
             "off-policy (the teacher's logits on the data)" if not distill.on_policy else
             f"on-policy on {distill.on_policy:.0%} of the steps (the student's own samples, up to "
             f"{distill.max_new_tokens} tokens)")
    model, peft_config = trl_policy(recipe, args, model_path)
    model.config.use_cache = False
    teacher = load_teacher(recipe)
    collator = PromptCollator(data_collator(recipe, tokenizer), tokenizer.pad_token_id)
    trainer = gkd().GKDTrainer(model=model, teacher_model=teacher, args=args, train_dataset=data.train,
                         eval_dataset=data.eval, data_collator=collator, processing_class=tokenizer,
                         callbacks=callbacks, peft_config=peft_config)
    trainable, total = count_parameters(trainer.model)
    log.info("trainable parameters: %d of %d (%.2f%%); the teacher's %d frozen", trainable, total,
             100 * trainable / max(total, 1), count_parameters(teacher)[1])
    return trainer, data
