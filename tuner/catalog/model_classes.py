"""What transformers says about each model class: the auto class a config belongs to (causal LM or image-text),
and the attention implementations a causal-LM class loads with.

transformers refuses, when a model loads, an attention implementation its class does not support (Gemma-2 has no
sdpa); ``tuner validate`` must refuse the same recipe first, in transformers' words, and fast, without torch.  So
the answers are generated from transformers and shipped in ``model_classes.json`` (one entry per model_type that
``AutoModelForCausalLM`` maps); ``tests/test_model_loads.py`` regenerates the table from the installed
transformers and compares (``python -m tuner.catalog.model_classes --write`` rewrites it).  Where the installed
transformers is not the one the table was made from, or a model_type is not in it, transformers itself is asked
(lazily: a few seconds, once per process).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TABLE_FILE = Path(__file__).with_name("model_classes.json")


@dataclass(frozen=True)
class ModelClass:
    """One causal-LM class as transformers describes it."""

    name: str  # e.g. Gemma2ForCausalLM
    sdpa: bool  # _supports_sdpa: loads with attn_implementation="sdpa"
    flash: bool  # _supports_flash_attn: loads with flash_attention_2 (where flash-attn is installed)
    refusals: dict  # transformers' own first sentence when it refuses "sdpa" or "flash"
    transformers_version: str

    def supports(self, attention: str) -> bool:
        """Whether this class loads with tuner's ``memory.attention`` value (eager always; auto picks one)."""
        return {"sdpa": self.sdpa, "flash": self.flash}.get(attention, True)


def attention_for(requested: str, cls: ModelClass | None, flash_problem: str | None) -> tuple[str, str]:
    """The attention a run loads with (``flash``, ``sdpa`` or ``eager``) for ``memory.attention``, and why: flash
    where requested (or auto), usable (``flash_problem`` None: flash-attn installed, an Ampere or newer GPU) and
    supported by the class; else sdpa where the class supports it, else eager -- transformers' own default order.
    ``cls`` None (a class not known here) is taken to support both, as transformers' default would try them."""
    if requested in ("eager", "sdpa"):
        return requested, f"{requested} attention requested"
    name = cls.name if cls else "the model class"
    if flash_problem is None and (cls is None or cls.flash):
        return "flash", "flash-attn is installed and the GPU supports it"
    why = f"{name} does not support flash-attention" if flash_problem is None else flash_problem
    if requested == "flash":
        why = f"flash attention requested but {why}"
    if cls is None or cls.sdpa:
        return "sdpa", f"{why}; using sdpa" if requested == "auto" else f"{why}; falling back to sdpa"
    return "eager", f"{why}, and {name} has no sdpa in transformers {cls.transformers_version}; using eager"


def installed_transformers_version() -> str | None:
    """The installed transformers' version, read from its metadata (no import); None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE_FILE.read_text())


CAUSAL_LM = "AutoModelForCausalLM"
IMAGE_TEXT = "AutoModelForImageTextToText"
SEQUENCE_CLASSIFICATION = "AutoModelForSequenceClassification"  # a reward model: the body under a score head
BASE_MODEL = "AutoModel"  # the body alone: what a score head is put on where transformers has no class with one


def auto_class_for(config: dict) -> str:
    """The auto class that builds ``config`` (:data:`CAUSAL_LM` or :data:`IMAGE_TEXT`), from transformers' own
    mappings (shipped in the table, asked of transformers where the table is stale): a model_type only the
    image-text mapping holds is image-text; one both hold (gemma3, llama4, qwen3_5) is image-text when the config
    names an image-text class in ``architectures`` or carries a ``vision_config``; anything else is a causal LM
    (and a type neither maps fails where transformers builds it, in its words)."""
    model_type = config.get("model_type")
    causal, image_text = _mapping(CAUSAL_LM), _mapping(IMAGE_TEXT)
    if model_type not in image_text:
        return CAUSAL_LM
    if model_type not in causal:
        return IMAGE_TEXT
    named = set(config.get("architectures") or ())
    if named & set(image_text.values()) or "vision_config" in config:
        return IMAGE_TEXT
    return CAUSAL_LM


def score_head_class(model_type: str) -> str | None:
    """The class a reward model of ``model_type`` is built as (TRL's reward models: the body under a one-output
    ``score`` head): transformers' own sequence-classification class where it maps one, else the one
    :mod:`tuner.loading.score_head` puts together from transformers' ``GenericForSequenceClassification`` and the
    type's base model (named as transformers names its own: Llama4TextModel -> Llama4TextForSequenceClassification);
    None where transformers has no base model for the type to put a head on (:func:`no_score_head_reason`)."""
    native = _mapping(SEQUENCE_CLASSIFICATION).get(model_type)
    if native:
        return native
    base = _mapping(BASE_MODEL).get(model_type)
    if base is None or "For" in base:
        return None
    return base.removesuffix("Model") + "ForSequenceClassification"


def no_score_head_reason(model_type: str) -> str:
    """Why no reward model of ``model_type`` can be built, in terms of transformers' own mappings."""
    base = _mapping(BASE_MODEL).get(model_type)
    body = (f"its {BASE_MODEL} class is {base}, which ends in its own output head (no hidden states to score)" if base
            else f"{BASE_MODEL} maps no base model to it")
    return (f"transformers {installed_transformers_version() or ''} maps no sequence-classification class to "
            f"{model_type}, and {body}, so no score head can be put on it")


@lru_cache(maxsize=4)
def _mapping(auto_class: str) -> dict[str, str]:
    """model_type -> class name of one auto class, as transformers maps it."""
    table = _table()
    if installed_transformers_version() == table["transformers_version"] or installed_transformers_version() is None:
        return table["mappings"][auto_class]
    return _installed_mappings()[auto_class]


def _installed_mappings() -> dict[str, dict[str, str]]:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        MODEL_MAPPING_NAMES,
    )

    return {CAUSAL_LM: dict(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())),
            IMAGE_TEXT: dict(sorted(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.items())),
            SEQUENCE_CLASSIFICATION: dict(sorted(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.items())),
            BASE_MODEL: {model_type: name for model_type, name in sorted(MODEL_MAPPING_NAMES.items())  # the ones tuner
                         if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # plans: causal LMs, image-text
                         or model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES}}


@lru_cache(maxsize=256)
def model_class(model_type: str) -> ModelClass | None:
    """The causal-LM class transformers builds for ``model_type``, from the shipped table when it was made by the
    installed transformers, else from transformers itself; None when transformers maps no causal LM to it."""
    table = _table()
    version = installed_transformers_version()
    if version == table["transformers_version"]:
        entry = table["classes"].get(model_type)
        if entry is not None or model_type in table["unbuildable"]:
            return _from_entry(entry, version) if entry else None
    if version is None:
        return None
    entry = describe(model_type)
    return _from_entry(entry, version) if entry else None


def _from_entry(entry: dict, version: str) -> ModelClass:
    return ModelClass(entry["class"], entry["sdpa"], entry["flash"], entry.get("refusals", {}), version)


def describe(model_type: str) -> dict | None:
    """Ask the installed transformers about ``model_type``'s causal-LM class (imports it: seconds, not for the
    fast path); None when no causal LM is mapped to it or its class cannot be imported here."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name is None:
        return None
    try:
        cls = getattr(transformers, name)
    except (AttributeError, ImportError):  # a class whose optional dependency is missing here
        return None
    entry = {"class": name, "sdpa": bool(cls._supports_sdpa), "flash": bool(cls._supports_flash_attn)}
    refusals = {}
    if not cls._supports_sdpa:
        refusals["sdpa"] = _first_sentence(cls._sdpa_can_dispatch, cls)
    if not cls._supports_flash_attn:
        refusals["flash"] = _first_sentence(lambda stub: cls._flash_attn_can_dispatch(stub, 2), cls)
    if refusals:
        entry["refusals"] = refusals
    return entry


def _first_sentence(check, cls) -> str:
    """transformers' own refusal, from its check run on a stand-in of the class (no model is built)."""
    from types import SimpleNamespace

    stub = type(cls.__name__, (), {"_supports_sdpa": cls._supports_sdpa, "_supports_flash_attn": cls._supports_flash_attn,
                                   "config": SimpleNamespace(_name_or_path="MODEL")})()
    try:
        check(stub)
    except (ValueError, ImportError) as exc:
        return str(exc).split(". ")[0].strip() + "."
    return f"{cls.__name__} refuses it."


def generate_table() -> dict:
    """The table as the installed transformers states it (imports every causal-LM class: tens of seconds)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    classes, unbuildable = {}, []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        entry = describe(model_type)
        if entry is None:
            unbuildable.append(model_type)
        else:
            classes[model_type] = entry
    return {"_comment": "generated by `python -m tuner.catalog.model_classes --write` from transformers; do not edit",
            "transformers_version": installed_transformers_version(), "classes": classes, "unbuildable": unbuildable,
            "mappings": _installed_mappings()}


def table_text(table: dict) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    text = table_text(generate_table())
    if "--write" in sys.argv:
        from tuner.fileio import atomic_write_text

        atomic_write_text(TABLE_FILE, text)
        print(f"wrote {TABLE_FILE}")
    else:
        print(text, end="")
