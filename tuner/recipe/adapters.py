"""The recipe's adapter settings as PEFT states them: the one ``LoraConfig`` training, inference and the planner's
trace (``tuner plan --simulate``) all wrap a model with, so the traced model is the one that trains."""
from __future__ import annotations

from tuner.recipe.schema import Recipe


def lora_config(recipe: Recipe, excluded: list[str] | None = None):
    """peft's LoraConfig for the recipe's method.lora settings (peft is imported here only); ``excluded``: the
    modules no adapter may go on (an image-text model's parts method.train leaves out:
    :func:`tuner.loading.trained_parts.untrained_modules`)."""
    from peft import LoraConfig

    lora = recipe.method.lora
    return LoraConfig(
        exclude_modules=excluded or None,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        target_parameters=lora.target_parameters or None,
        modules_to_save=lora.modules_to_save or None,
        # a reward model's head (score) is new: SEQ_CLS trains and saves it in full beside the adapters
        task_type="SEQ_CLS" if recipe.objective.kind == "reward" else "CAUSAL_LM",
    )
