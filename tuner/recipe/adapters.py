"""The recipe's adapter settings as PEFT states them: the one ``LoraConfig`` training, inference and the planner's
trace (``tuner plan --simulate``) all wrap a model with, so the traced model is the one that trains."""
from __future__ import annotations

from tuner.recipe.schema import Recipe


# An image-text model's adapters go on its language model only (transformers 5 names it ``language_model`` in every
# image-text class): the vision tower and projector stay as they are unless method.lora.modules_to_save trains them.
LANGUAGE_MODEL_ONLY = r"(?!(.*\.)?language_model\.).*"


def lora_config(recipe: Recipe, image_text: bool = False):
    """peft's LoraConfig for the recipe's method.lora settings (peft is imported here only); for an image-text
    model (``image_text``) every module outside the language model is excluded from the targets."""
    from peft import LoraConfig

    lora = recipe.method.lora
    return LoraConfig(
        exclude_modules=LANGUAGE_MODEL_ONLY if image_text else None,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        target_parameters=lora.target_parameters or None,
        modules_to_save=lora.modules_to_save or None,
        # a reward model's head (score) is new: SEQ_CLS trains and saves it in full beside the adapters
        task_type="SEQ_CLS" if recipe.objective.kind == "reward" else "CAUSAL_LM",
    )
