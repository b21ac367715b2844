"""Reward models (objective.kind: reward) with TRL's RewardTrainer: the config, the model under its head, the pairs.

The model is model.id's body under a one-output sequence-classification head (``score``, newly initialised), fed
each pair's chosen and rejected sequences stacked in one micro-batch and trained on the margin loss
``-log sigmoid(score(chosen) - score(rejected))``.  TRL logs the share of pairs scored the right way round as
``accuracy`` (``eval_accuracy`` on the held-out pairs, measured before training too); LoRA/QLoRA wrap the body with
adapters and train the head in full (peft's SEQ_CLS task), which the saved adapter holds.
"""
from __future__ import annotations

import logging

from tuner.data.prepare import PreparedData
from tuner.recipe.schema import Recipe

log = logging.getLogger("tuner")


def reward_arguments(recipe: Recipe) -> tuple[type, dict]:
    """RewardConfig and the objective's settings from the recipe (the rest come from training_arguments)."""
    from trl import RewardConfig

    return RewardConfig, dict(max_length=recipe.training.max_seq_length, disable_dropout=True,
                              eval_on_start=recipe.data.eval_fraction > 0,  # held-out pair accuracy before training
                              trust_remote_code=recipe.model.trust_remote_code)


def reward_trainer(recipe: Recipe, args, tokenizer, callbacks, model_path: str | None = None
                   ) -> tuple[object, PreparedData]:
    """TRL's RewardTrainer for the recipe (its model from ``model_path`` when given), and what became of its pairs."""
    from trl import RewardTrainer

    from tuner.data.formats import DEFAULT_CHAT_TEMPLATE
    from tuner.data.prepare import split_samples, used_columns
    from tuner.data.preference import render_rows_within_bounds, with_prompt
    from tuner.data.sources import DataError
    from tuner.loading.model import count_parameters, for_training, load_model

    train_raw, eval_raw, data_format = split_samples(recipe)

    def for_trl(raw):  # the columns TRL reads, every prompt explicit (as for dpo)
        return raw.select_columns(used_columns(data_format, raw.column_names)).map(with_prompt)

    train_raw = for_trl(train_raw)
    eval_raw = for_trl(eval_raw) if eval_raw is not None else None
    if isinstance(train_raw[0]["chosen"], list):
        if tokenizer.chat_template is None:
            tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE  # as SFT renders conversations (docs/training.md)
        for rows in (train_raw, eval_raw or ()):
            render_rows_within_bounds(rows, data_format, tokenizer)
    log.info("data: %d training and %d held-out preference pairs", len(train_raw), len(eval_raw) if eval_raw else 0)
    model = load_model(recipe, model_path)
    # the head scores each sequence's last token before padding (an image-text model's text config holds the id)
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model, adapters = for_training(model, recipe)
    trainer = RewardTrainer(model=model, args=args, train_dataset=train_raw, eval_dataset=eval_raw,
                            processing_class=tokenizer, callbacks=callbacks, peft_config=adapters)
    trainable, total = count_parameters(trainer.model)
    log.info("reward head: one score per sequence; trainable parameters: %d of %d (%.2f%%)", trainable, total,
             100 * trainable / max(total, 1))
    max_length = recipe.training.max_seq_length
    dropped = len(train_raw) - len(trainer.train_dataset)  # TRL drops a pair either of whose sequences is too long
    if not len(trainer.train_dataset):
        raise DataError(f"training.max_seq_length: every one of the {len(train_raw)} training pairs is longer than "
                        f"{max_length} tokens; raise max_seq_length or shorten the answers.")
    if dropped:
        log.warning("%d of %d training pairs were longer than max_seq_length=%d and were dropped", dropped,
                    len(train_raw), max_length)
    return trainer, PreparedData(trainer.train_dataset, trainer.eval_dataset, data_format, 0, dropped, eval_raw)
