"""The class a reward model is built as: the body under a one-output ``score`` head, on any type with a base model.

transformers has a sequence-classification class for 86 of its causal-LM types (llama, qwen3, ...), 48 of them
nothing but its ``GenericForSequenceClassification`` (a ``score`` linear, hidden x labels, no bias, on the base
model's last hidden state, read at the last token before padding) on the type's ``PreTrainedModel``.  For a type it
maps none to (glm4_moe, llama4_text, gemma4, llava, ...), the same two classes are put together here and
registered with ``AutoModelForSequenceClassification`` -- transformers' own way to add a class to an auto mapping,
which runs no code from the model's folder -- so training, the planner's trace and a grpo run's reward model build,
save (config.json names the class in ``architectures``) and load back a reward model through one auto class.
"""
from __future__ import annotations

from functools import lru_cache


def sequence_classification_class(model_type: str | None):
    """``AutoModelForSequenceClassification``, able to build ``model_type``'s reward model: transformers' own class
    where it maps one, else :func:`generic_score_head`, registered; a type with no base model to put a head on
    (see :func:`tuner.catalog.model_classes.score_head_class`) is left for transformers to refuse in its words."""
    from transformers import AutoModelForSequenceClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    from tuner.catalog.model_classes import score_head_class

    if model_type not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES and score_head_class(model_type or ""):
        generic_score_head(model_type)
    return AutoModelForSequenceClassification


@lru_cache(maxsize=None)
def generic_score_head(model_type: str) -> type:
    """transformers' ``GenericForSequenceClassification`` on ``model_type``'s ``PreTrainedModel`` (the parent its
    base model class has: its weight initialisation, attention and sharding flags), with the base model
    ``AutoModel`` builds for the type as its body -- for an image-text type the whole model (vision tower,
    projector, language model), whose last hidden state the head reads.  Named as transformers would name it
    (Llama4TextModel -> Llama4TextForSequenceClassification) and registered with
    ``AutoModelForSequenceClassification`` for the type's config class."""
    import transformers
    from transformers import AutoModelForSequenceClassification, PreTrainedModel
    from transformers.modeling_layers import GenericForSequenceClassification
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    from tuner.catalog.model_classes import score_head_class

    base = getattr(transformers, MODEL_MAPPING_NAMES[model_type])
    pretrained = next(parent for parent in base.__mro__ if PreTrainedModel in parent.__bases__)
    config_class = CONFIG_MAPPING[model_type]
    head = type(score_head_class(model_type), (GenericForSequenceClassification, pretrained),
                {"config_class": config_class, "__module__": __name__,
                 "__doc__": f"{base.__name__} under a one-output score head (tuner's reward models)."})
    AutoModelForSequenceClassification.register(config_class, head, exist_ok=True)
    return head
