"""The decoder-layer class FSDP wraps, read from the model itself rather than guessed from its name.

A wrong class name fails only at launch ("Could not find the transformer layer class to wrap"),
so the name comes from the model class's own ``_no_split_modules``, found through the model's
config.json (``architectures``, else transformers' model-type -> causal-LM class mapping).
transformers is imported here, inside functions, only when an FSDP run is rendered.
"""
from __future__ import annotations

from pathlib import Path

from tuner.catalog.demo import builtin_model, is_builtin
from tuner.fileio import user_path
from tuner.reason import library_words
from tuner.recipe.schema import ModelSection
from tuner.recipe.source import RecipeError


def _config_source(model: ModelSection) -> str:
    return str(user_path(model.id)) if user_path(model.id).exists() else model.id


def model_class(model: ModelSection):
    """The causal-LM class that ``AutoModelForCausalLM`` would build for this model."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if is_builtin(model.id):
        return getattr(transformers, builtin_model(model.id).architecture)  # known without building it
    source = _config_source(model)
    if Path(source).is_dir() and not (Path(source) / "config.json").is_file():
        raise RecipeError([f"model.id: {model.id}: the directory has no config.json; point at a saved Hugging Face "
                           "model (the folder save_pretrained wrote)."])
    try:
        config = AutoConfig.from_pretrained(source, revision=model.revision, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as exc:
        model_type = _catalogued_model_type(model)
        if model_type is None:
            reason = library_words(exc, 1000).rstrip(".")
            raise RecipeError([f"model.id: cannot read the config of {model.id!r} to find FSDP's layer class ({reason}). "
                               "Download the model first (its config.json is enough) or point model.id at a local "
                               "directory."]) from None
        config = type("CatalogConfig", (), {"model_type": model_type})  # tuner's catalog knows the model's type
    auto_map = getattr(config, "auto_map", None) or {}
    if model.trust_remote_code and "AutoModelForCausalLM" in auto_map:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        return get_class_from_dynamic_module(auto_map["AutoModelForCausalLM"], source, revision=model.revision)
    names = list(getattr(config, "architectures", None) or [])
    mapped = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if mapped:
        names.append(mapped)
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise RecipeError([f"model.id: transformers has no causal-LM class for {model.id!r} (model_type "
                       f"{config.model_type!r}); upgrade transformers or set trust_remote_code if the model ships its code."])


def _catalogued_model_type(model: ModelSection) -> str | None:
    """The model_type tuner's catalog records for a hub id whose config.json cannot be read (offline), else None."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    if model.trust_remote_code:
        return None  # the model's own code decides its class
    try:
        facts = model_facts(model.id, model.revision)
    except UnknownModelError:
        return None
    return facts.model_type


def decoder_layer_classes(model: ModelSection) -> list[str]:
    """Names of the modules FSDP should wrap one by one: the model's ``_no_split_modules``."""
    cls = model_class(model)
    names = list(getattr(cls, "_no_split_modules", None) or [])
    if not names:
        raise RecipeError([f"model.id: {cls.__name__} declares no _no_split_modules, so FSDP has no decoder-layer "
                           "class to wrap; use memory.distributed: deepspeed for this model."])
    return names
