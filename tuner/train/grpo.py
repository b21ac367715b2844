"""Online RL (grpo) with TRL's GRPOTrainer: the config, the prompts, the rewards, the policy and its reference.

Every generation round samples ``num_generations`` completions per prompt with the policy's own ``generate`` (or
vLLM on GPUs), scores them with the recipe's rewards and makes the better ones of each group likelier.  With
``beta > 0`` full fine-tuning keeps a frozen reference copy, which TRL loads itself from the model's folder; with
LoRA/QLoRA the reference is the same model with the adapter disabled.  TRL 1.16 does not cut prompts: prompts of
more than ``max_prompt_length`` tokens are dropped here, counted, so every sequence stays within the plan.
"""
from __future__ import annotations

import logging

from tuner.data.prepare import PreparedData
from tuner.recipe.schema import Recipe

log = logging.getLogger("tuner")

VLLM_MODES = {"vllm_colocate": "colocate", "vllm_server": "server"}


def grpo_arguments(recipe: Recipe) -> tuple[type, dict]:
    """GRPOConfig and the objective's settings from the recipe (the rest come from training_arguments, as for
    SFT and DPO)."""
    from trl import GRPOConfig

    objective, grpo = recipe.objective, recipe.objective.grpo
    vllm = VLLM_MODES.get(grpo.generation)
    settings = dict(
        beta=objective.beta, loss_type=objective.loss_type, num_generations=grpo.num_generations,
        max_completion_length=grpo.max_completion_length, steps_per_generation=grpo.steps_per_generation,
        importance_sampling_level=grpo.importance_sampling_level, temperature=grpo.temperature, top_p=grpo.top_p,
        reward_weights=[reward.weight for reward in grpo.rewards],
        disable_dropout=True,  # the policy, its old self and the reference score the same tokens alike
        eval_on_start=recipe.data.eval_fraction > 0,  # the held-out reward before training
        trust_remote_code=recipe.model.trust_remote_code,
        model_init_kwargs={"revision": recipe.model.revision} if recipe.model.revision else None,  # the reference
        include_num_input_tokens_seen="no",  # GRPOTrainer counts prompt and completion tokens itself
        use_vllm=vllm is not None)
    if vllm:
        settings.update(vllm_mode=vllm, vllm_gpu_memory_utilization=grpo.vllm_gpu_memory_utilization,
                        vllm_enable_sleep_mode=grpo.vllm_sleep_mode, vllm_max_model_length=recipe.training.max_seq_length,
                        vllm_server_host=recipe.hardware.main_process_ip or "127.0.0.1",
                        vllm_server_port=grpo.vllm_server_port)
    return GRPOConfig, settings


def _within_prompt_length(raw, tokenizer, limit: int, what: str):
    """The samples whose prompt is at most ``limit`` tokens, and how many were dropped (refused when all were)."""
    from tuner.data.prompts import prompt_ids
    from tuner.data.sources import DataError

    kept = raw.filter(lambda batch: [len(prompt_ids(prompt, tokenizer)) <= limit for prompt in batch["prompt"]],
                      batched=True, desc=f"measuring {what} prompts", load_from_cache_file=False)
    dropped = len(raw) - len(kept)
    if not len(kept):
        raise DataError(f"objective.grpo.max_prompt_length: every one of the {len(raw)} {what} prompts is longer than "
                        f"{limit} tokens; raise max_prompt_length (and max_seq_length) or shorten the prompts.")
    if dropped:
        log.warning("%d of %d %s prompts were longer than max_prompt_length=%d tokens and were dropped",
                    dropped, len(raw), what, limit)
    return kept, dropped


def grpo_trainer(recipe: Recipe, args, tokenizer, callbacks, model_path: str | None = None
                 ) -> tuple[object, PreparedData]:
    """TRL's GRPOTrainer for the recipe (its model from ``model_path`` when given), and what became of its prompts."""
    from trl import GRPOTrainer

    from tuner.data.formats import DEFAULT_CHAT_TEMPLATE
    from tuner.data.prepare import split_samples
    from tuner.loading.model import count_parameters
    from tuner.recipe.rewards import reward_names
    from tuner.train.preference import trl_policy
    from tuner.train.rewards import reward_functions

    grpo = recipe.objective.grpo
    train_raw, eval_raw, data_format = split_samples(recipe)
    if isinstance(train_raw[0]["prompt"], list) and tokenizer.chat_template is None:
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE  # as SFT renders conversations (docs/training.md)
    train_raw, dropped = _within_prompt_length(train_raw, tokenizer, grpo.max_prompt_length, "training")
    if eval_raw is not None:
        eval_raw, _ = _within_prompt_length(eval_raw, tokenizer, grpo.max_prompt_length, "held-out")
    log.info("data: %d training and %d held-out prompts; %d completions per prompt", len(train_raw),
             len(eval_raw) if eval_raw else 0, grpo.num_generations)
    functions, reward_tokenizers = reward_functions(recipe)
    model, peft_config = trl_policy(recipe, args, model_path)
    full = recipe.method.kind == "full"
    log.info("reference model: %s", "none (beta 0: no KL penalty)" if not recipe.objective.beta else
             "a frozen copy of the starting model, loaded by TRL" if full else
             "the same model with the adapter disabled")
    log.info("generation: %s", {"transformers": "the policy's own generate"}.get(grpo.generation, grpo.generation))
    trainer = GRPOTrainer(model=model, reward_funcs=functions, args=args, train_dataset=train_raw,
                          eval_dataset=eval_raw, processing_class=tokenizer,
                          reward_processing_classes=reward_tokenizers, callbacks=callbacks, peft_config=peft_config)
    trainer.reward_func_names = reward_names(grpo.rewards)  # TRL would name a reward model by its folder (final)
    if trainer.ref_model is not None:  # frozen: under autocast it then keeps no 16-bit copies of its weights
        trainer.ref_model.requires_grad_(False)
    trainable, total = count_parameters(trainer.model)
    log.info("trainable parameters: %d of %d (%.2f%%)", trainable, total, 100 * trainable / max(total, 1))
    return trainer, PreparedData(train_raw, eval_raw, data_format, 0, dropped, eval_raw)
