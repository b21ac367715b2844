"""Preference objectives (dpo, kto) with TRL's trainers: the config, the policy and its reference, the data.

The reference is the model training starts from.  Full fine-tuning loads it a second time, frozen (TRL shards it
like the policy under ZeRO-3/FSDP), unless ``objective.precompute_ref_log_probs`` lets TRL score every sample with
the policy before training instead.  With LoRA/QLoRA TRL wraps the model itself, so the reference is the same
model with the adapter disabled: no copy.
"""
from __future__ import annotations

import logging

from tuner.data.prepare import PreparedData
from tuner.recipe.schema import Recipe

log = logging.getLogger("tuner")


def objective_arguments(recipe: Recipe) -> tuple[type, dict]:
    """The TRL config class of the objective and its settings from the recipe."""
    objective = recipe.objective
    common = dict(beta=objective.beta, max_length=recipe.training.max_seq_length,
                  precompute_ref_log_probs=objective.precompute_ref_log_probs,
                  eval_on_start=recipe.data.eval_fraction > 0)  # the held-out rewards before training (all zero)
    if objective.kind == "dpo":
        from trl import DPOConfig

        losses, weights = [objective.loss_type], None
        if objective.sft_weight:
            losses, weights = [objective.loss_type, "sft"], [1.0, objective.sft_weight]
        return DPOConfig, dict(common, loss_type=losses, loss_weights=weights,
                               label_smoothing=objective.label_smoothing)
    from trl import KTOConfig

    return KTOConfig, dict(common, loss_type=objective.loss_type, desirable_weight=objective.desirable_weight,
                           undesirable_weight=objective.undesirable_weight)


def _counts(prepared, raw, max_length: int, completion_keys: tuple[str, ...]) -> tuple[int, int]:
    """(samples cut to max_length, samples TRL dropped because the prompt alone fills it)."""
    lengths = zip(prepared["prompt_ids"], *(prepared[key] for key in completion_keys))
    truncated = sum(len(prompt) + max(len(ids) for ids in completions) > max_length for prompt, *completions in lengths)
    return truncated, len(raw) - len(prepared)


def trl_policy(recipe: Recipe, args, model_path: str | None = None):
    """The model a TRL trainer trains (from ``model_path`` when given, else what model.id names), and the adapter
    settings it wraps it with itself (None for full fine-tuning): loaded as the recipe says, k-bit prepared for
    qlora, Liger's kernels chosen on ``args``."""
    from tuner.loading.model import choose_liger, for_training, load_model

    model = load_model(recipe, model_path)
    args.use_liger_kernel, reason = choose_liger(recipe.memory.liger, model.config.model_type, recipe.uses_gpu)
    log.info("liger kernels: %s", reason)
    return for_training(model, recipe)


def preference_trainer(recipe: Recipe, args, tokenizer, callbacks, model_path: str | None = None
                       ) -> tuple[object, PreparedData]:
    """TRL's DPOTrainer or KTOTrainer for the recipe (its model from ``model_path`` when given), and what became of
    its data."""
    from tuner.data.formats import DEFAULT_CHAT_TEMPLATE
    from tuner.data.prepare import split_samples, used_columns
    from tuner.data.preference import COMPLETION_KEYS, render_rows_within_bounds, with_prompt
    from tuner.data.sources import DataError
    from tuner.loading.model import count_parameters, load_model

    train_raw, eval_raw, data_format = split_samples(recipe)

    def for_trl(raw):  # the columns TRL reads, every prompt explicit (a file may mix both kinds of conversation)
        return raw.select_columns(used_columns(data_format, raw.column_names)).map(with_prompt)

    train_raw = for_trl(train_raw)
    eval_raw = for_trl(eval_raw) if eval_raw is not None else None
    keys = COMPLETION_KEYS[data_format]
    if isinstance(train_raw[0][keys[0]], list):
        if tokenizer.chat_template is None:
            tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE  # as SFT renders conversations (docs/training.md)
        for rows in (train_raw, eval_raw or ()):
            render_rows_within_bounds(rows, data_format, tokenizer)
    log.info("data: %d training and %d held-out %s samples", len(train_raw), len(eval_raw) if eval_raw else 0,
             data_format)

    model, peft_config = trl_policy(recipe, args, model_path)
    model.config.use_cache = False
    full = recipe.method.kind == "full"
    reference = load_model(recipe, model_path) if full and not recipe.objective.precompute_ref_log_probs else None
    if reference is not None:  # frozen: and autocast then keeps no 16-bit copies of its fp32 weights in the step
        reference.requires_grad_(False)
    log.info("reference model: %s", "a frozen copy of the starting model" if reference is not None else
             "the starting model's log-probabilities, computed before training" if full else
             "the same model with the adapter disabled")
    if recipe.objective.kind == "dpo":
        from trl import DPOTrainer as trainer_class
    else:
        from trl import KTOTrainer as trainer_class
    trainer = trainer_class(model=model, ref_model=reference, args=args, train_dataset=train_raw,
                            eval_dataset=eval_raw, processing_class=tokenizer, callbacks=callbacks,
                            peft_config=peft_config)
    trainable, total = count_parameters(trainer.model)
    log.info("trainable parameters: %d of %d (%.2f%%)", trainable, total, 100 * trainable / max(total, 1))
    max_length = recipe.training.max_seq_length
    if len(trainer.train_dataset) == 0:
        raise DataError(f"training.max_seq_length: every prompt of the {len(train_raw)} training samples fills "
                        f"{max_length} tokens, leaving nothing of the answers; raise max_seq_length or shorten the prompts.")
    truncated, dropped = _counts(trainer.train_dataset, train_raw, max_length, tuple(f"{key}_ids" for key in keys))
    if truncated:
        log.warning("%d of %d training samples were longer than max_seq_length=%d and were truncated",
                    truncated, len(train_raw), max_length)
    if dropped:
        log.warning("%d of %d training samples had a prompt of max_seq_length=%d tokens or more and were dropped",
                    dropped, len(train_raw), max_length)
    return trainer, PreparedData(trainer.train_dataset, trainer.eval_dataset, data_format, truncated, dropped, eval_raw)
