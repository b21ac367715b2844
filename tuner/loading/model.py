"""Build a model and tokenizer from a recipe: path, dtype, attention kernel, quantisation, adapters.

Training and inference both load through here, so a model behaves the same in both.
torch and transformers are imported inside functions: the core stays import-light.
"""
from __future__ import annotations

import importlib.util
import logging

from tuner.catalog.demo import is_builtin
from tuner.catalog.hub import HUB_ID
from tuner.fileio import user_path
from tuner.loading.demo_model import builtin_model_path
from tuner.reason import library_words
from tuner.recipe.adapters import lora_config
from tuner.recipe.model_checks import remote_code_problem
from tuner.recipe.schema import Recipe

log = logging.getLogger("tuner")



class ModelLoadError(Exception):
    """The model cannot be loaded; the message says what to do."""


def resolve_model_path(model_id: str) -> str:
    """A local directory for built-in and local models; the hub id unchanged otherwise."""
    if is_builtin(model_id):
        try:
            return str(builtin_model_path(model_id))
        except ValueError as exc:  # builtin:x, a built-in that does not exist
            raise ModelLoadError(f"model.id: {exc}.") from None
    path = user_path(model_id)
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model.id: {model_id}: the directory has no config.json; point at a saved "
                                 "Hugging Face model (the folder save_pretrained wrote).")
        return str(path)
    if not HUB_ID.match(model_id):
        raise ModelLoadError(f"model.id: {model_id}: no such directory, and not a hub id (org/name); give the folder "
                             "save_pretrained wrote, or a hub id such as Qwen/Qwen2.5-0.5B.")
    return model_id


def cannot_load(model_id: str, exc: Exception) -> ModelLoadError:
    """One paragraph for a model that did not load: offline and not cached is the common case on GPU nodes."""
    import os

    reason = library_words(exc, 1000)
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return ModelLoadError(
            f"model.id: {model_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, so it cannot "
            f"be downloaded. Download it where there is network (hf download {model_id}) into this "
            f"machine's cache, or point model.id at a local directory. ({reason})")
    return ModelLoadError(
        f"model.id: cannot load {model_id!r}: {reason} Check the id (org/name) and model.revision, log in for "
        "gated models (hf auth login), or point model.id at a local directory.")


def not_loaded(recipe: Recipe, source: str, exc: Exception) -> ModelLoadError:
    """A folder or hub id that from_pretrained could not load, in one paragraph: for a local folder (a run's
    final/, a --model folder) what the library found wrong in it; for a hub id where to get it."""
    if not user_path(source).is_dir():
        return cannot_load(recipe.model.id, exc)
    reason = library_words(exc, 500)
    if isinstance(exc, ImportError):  # a class it names needs a library this environment lacks: no file is wrong
        return ModelLoadError(f"{source}: cannot be loaded here: a library its classes need is not installed "
                              f"({reason}). Install it in this environment (a torch extension such as torchvision: "
                              "the build made for the installed torch), then run again.")
    return ModelLoadError(f"{source}: cannot be loaded ({type(exc).__name__}: {reason}); a file in it is damaged or "
                          "does not match the others. Restore it, or load another folder.")


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def flash_problem() -> str | None:
    """Why flash-attention 2 cannot run here (flash-attn missing, no Ampere or newer CUDA GPU); None when it can."""
    import torch

    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed"
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8):
        return "flash-attn needs an Ampere or newer CUDA GPU"
    return None


TRANSFORMERS_ATTENTION = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}


def choose_attention(requested: str, model_type: str | None = None,
                     flash_missing: str | None = None) -> tuple[str, str]:
    """The attention implementation to load with (transformers' name) and why (logged, never silent): the rule of
    :func:`tuner.catalog.model_classes.attention_for`, with what this machine has (or ``flash_missing``: why a
    build elsewhere cannot run flash-attn) and the model class supports."""
    from tuner.catalog.model_classes import attention_for, model_class

    cls = model_class(model_type) if model_type else None
    attention, reason = attention_for(requested, cls, flash_missing or flash_problem())
    return TRANSFORMERS_ATTENTION[attention], reason


def model_type_of(recipe: Recipe, source: str) -> str | None:
    """The model_type of the model loaded from ``source`` (its config.json, the catalog or the hub cache); None
    where tuner cannot read it before loading (transformers then meets its own checks)."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    model_id = recipe.model.id if source == resolve_model_path(recipe.model.id) else source
    try:
        return model_facts(model_id, recipe.model.revision, recipe.model.trust_remote_code).model_type
    except UnknownModelError:
        return None


def source_config(recipe: Recipe, source: str) -> dict:
    """The config.json mapping of the model loaded from ``source`` (a built-in's, a folder's, the catalog's or the
    hub's: :func:`tuner.catalog.models.model_config`); empty where tuner cannot read it before loading."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_config

    model_id = recipe.model.id if source == resolve_model_path(recipe.model.id) else source
    try:
        return model_config(model_id, recipe.model.revision, recipe.model.trust_remote_code)
    except UnknownModelError:
        return {}


def auto_class(config: dict):
    """transformers' auto class that builds ``config`` (causal LM or image-text), from transformers' own mappings
    (:func:`tuner.catalog.model_classes.auto_class_for`), never from the model's name."""
    import transformers

    from tuner.catalog.model_classes import auto_class_for

    return getattr(transformers, auto_class_for(config))


def is_image_text(config: dict) -> bool:
    from tuner.catalog.model_classes import IMAGE_TEXT, auto_class_for

    return auto_class_for(config) == IMAGE_TEXT


def load_processor(recipe: Recipe, path: str | None = None):
    """An image-text model's processor (its image processor, tokenizer and chat template), from its folder."""
    from transformers import AutoProcessor

    source = path or resolve_model_path(recipe.model.id)
    refuse_custom_code(recipe, source)
    try:
        processor = AutoProcessor.from_pretrained(source, revision=recipe.model.revision,
                                                  trust_remote_code=recipe.model.trust_remote_code)
    except Exception as exc:  # whatever a damaged file makes the library raise: one message naming the folder
        raise not_loaded(recipe, source, exc) from None
    if not hasattr(processor, "image_processor"):
        raise ModelLoadError(f"{source}: an image-text model without an image processor (processor_config.json or "
                             "preprocessor_config.json); save its processor beside the weights.")
    if processor.tokenizer.pad_token is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    return processor


def choose_liger(requested: bool, model_type: str, on_gpu: bool) -> tuple[bool, str]:
    """Whether the Trainer should patch in Liger's fused kernels, and why (logged either way)."""
    if not requested:
        return False, "off (memory.liger: false)"
    if importlib.util.find_spec("liger_kernel") is None:
        return False, "requested but liger-kernel is not installed (pip install 'tuner[liger]'); training without fused kernels"
    if not on_gpu:
        return False, "requested but Liger's Triton kernels need a GPU; training without fused kernels"
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return False, f"requested but liger-kernel has no kernels for model type {model_type!r}; training without them"
    return True, f"fused RMSNorm/SwiGLU/RoPE/linear-cross-entropy kernels for {model_type}"


def refuse_custom_code(recipe: Recipe, source: str) -> None:
    """The recipe's rule for code shipped with a model, applied to the folder or id actually loaded (``--model``
    or a run's final/ may differ from model.id): refused in tuner's words, before transformers would run it."""
    problem = remote_code_problem(source, recipe.model.revision, recipe.model.trust_remote_code)
    if problem:
        raise ModelLoadError(f"model.trust_remote_code: {problem}")


def load_tokenizer(recipe: Recipe, path: str | None = None):
    from transformers import AutoTokenizer

    source = path or resolve_model_path(recipe.model.id)
    refuse_custom_code(recipe, source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, revision=recipe.model.revision, trust_remote_code=recipe.model.trust_remote_code)
        tokenizer("a")  # a setting of the wrong type (model_max_length: []) fails only when text is encoded
    except Exception as exc:  # whatever a damaged file makes the library raise: one message naming the folder
        raise not_loaded(recipe, source, exc) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def quantization_config(recipe: Recipe):
    """bitsandbytes settings for qlora; the 4-bit storage dtype matches the compute dtype when sharded."""
    quant = recipe.method.quantization
    if quant is None:
        return None
    from transformers import BitsAndBytesConfig

    compute = torch_dtype(recipe.model.dtype)
    if quant.bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    sharded = recipe.memory.distributed == "fsdp" or (recipe.memory.distributed == "deepspeed" and recipe.memory.zero_stage == 3)
    extra = {"bnb_4bit_quant_storage": compute} if sharded else {}
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quant.quant_type,
        bnb_4bit_use_double_quant=quant.double_quant,
        bnb_4bit_compute_dtype=compute,
        **extra,
    )


def trained_class(recipe: Recipe, config: dict | None) -> tuple[type, dict]:
    """The transformers auto class training builds for ``config`` and its extra arguments: for a reward model the
    body under a one-output sequence-classification head (``score``, newly initialised; TRL's reward models; for a
    type transformers has no such class, the one :mod:`tuner.loading.score_head` registers), else the class the
    config belongs to (:func:`auto_class`; the causal LM where no config is read)."""
    from transformers import AutoModelForCausalLM

    from tuner.loading.score_head import sequence_classification_class

    if recipe.objective.kind == "reward":
        return sequence_classification_class((config or {}).get("model_type")), {"num_labels": 1}
    return (auto_class(config) if config else AutoModelForCausalLM), {}


def load_model(recipe: Recipe, path: str | None = None, **kwargs):
    """The base model as the recipe describes it (no adapters yet); ``kwargs`` add to or replace the
    ``from_pretrained`` arguments (inference passes device_map, max_memory and its own quantisation config); built
    through the auto class its config belongs to (causal LM or image-text; a reward model's classification head)."""
    source = path or resolve_model_path(recipe.model.id)
    auto_class, head = trained_class(recipe, source_config(recipe, source))
    refuse_custom_code(recipe, source)
    attention, reason = choose_attention(recipe.memory.attention, model_type_of(recipe, source))
    log.info("attention: %s (%s)", attention, reason)
    arguments = dict(
        revision=recipe.model.revision,
        dtype=torch_dtype(recipe.model.dtype),
        attn_implementation=attention,
        quantization_config=quantization_config(recipe),
        trust_remote_code=recipe.model.trust_remote_code,
        **head,
    )
    try:
        model = auto_class.from_pretrained(source, **{**arguments, **kwargs})
    except Exception as exc:  # whatever a damaged file makes the library raise: one message naming the folder
        raise not_loaded(recipe, source, exc) from None
    keep_4bit_cpu_inference_generic(model)
    return model


def keep_4bit_cpu_inference_generic(model) -> None:
    """bitsandbytes 0.50 repacks 4-bit weights for its AVX512-BF16 CPU kernel in eval mode and fails on shapes
    it cannot block (the demo model's 344-wide MLP); the generic path, which training uses anyway, always works."""
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False


def prepare_for_adapters(model, recipe: Recipe):
    """The base model ready for adapters: k-bit preparation (fp32 norms, input gradients) for qlora."""
    if recipe.method.kind != "qlora":
        return model
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=recipe.memory.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )


def for_training(model, recipe: Recipe):
    """(model, LoraConfig or None): ``model`` ready to train as the recipe says and the plan counts it.  Full
    fine-tuning freezes an image-text model's parts that ``method.train`` leaves out; lora/qlora k-bit prepares it
    and gives the adapters' config, its targets inside the named parts only and off the linears PEFT cannot run
    (TRL's trainers wrap the model themselves)."""
    from tuner.loading.trained_parts import freeze_untrained_parts, untrained_modules

    if recipe.method.kind == "full":
        if frozen := freeze_untrained_parts(model, recipe):
            log.info("frozen (not in method.train): %s", ", ".join(frozen))
        return model, None
    excluded = (untrained_modules(model, recipe) or []) + _unadaptable(model, recipe)
    return prepare_for_adapters(model, recipe), lora_config(recipe, excluded)


def _unadaptable(model, recipe: Recipe) -> list[str]:
    """The modules of ``model`` its inventory marks as ones PEFT's LoRA cannot run (the plan leaves out the same:
    :func:`tuner.catalog.meta_inventory.unadaptable_linears`)."""
    from tuner.catalog.model_config import ModelConfigError, UnknownModelError
    from tuner.catalog.models import model_facts

    try:
        inventory = model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code).inventory
    except (UnknownModelError, ModelConfigError) as exc:  # launched unplanned (--force): PEFT's own picks
        log.info("LoRA targets as PEFT picks them: no inventory of the model (%s)", exc)
        return []
    found = inventory.lora_excluded([name for name, _ in model.named_modules()])
    if found:
        log.info("no adapter on %d modules whose forward is not a plain linear map (%s)", len(found),
                 type(model.get_submodule(found[0])).__name__)
    return found


def trainable_model(model, recipe: Recipe):
    """:func:`for_training`, with the adapters put on (lora/qlora)."""
    model, adapters = for_training(model, recipe)
    if adapters is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, adapters)


def build_on_meta(recipe: Recipe, layers: int | None = 2, flash_missing: str | None = None):
    """The recipe's model as training builds it -- its real class from its config, the attention this machine would
    load it with, bitsandbytes' layers for qlora (transformers' own quantizer), k-bit preparation and PEFT's
    adapters -- on the meta device: no weights, and at most ``layers`` decoder layers (they all hold the same
    modules; None: all); ``flash_missing``: see :func:`choose_attention`.  Raises what transformers, bitsandbytes or PEFT raise: a recipe that validates builds."""
    import torch
    from transformers import AutoConfig

    from tuner.catalog.models import model_config

    data = {key: value for key, value in model_config(recipe.model.id, recipe.model.revision,
                                                       recipe.model.trust_remote_code).items()
            if not key.startswith("_") and key not in ("transformers_version", "architectures")}
    if layers is not None and data.get("num_hidden_layers", 0) > layers:
        data["num_hidden_layers"] = layers
        if isinstance(data.get("layer_types"), list):
            data["layer_types"] = data["layer_types"][:layers]
    auto_class, head = trained_class(recipe, data)
    config = AutoConfig.for_model(**data, **head)
    attention, _ = choose_attention(recipe.memory.attention, config.model_type, flash_missing)
    with torch.device("meta"):
        model = auto_class.from_config(config, dtype=torch_dtype(recipe.model.dtype), attn_implementation=attention)
    quantization = quantization_config(recipe)
    if quantization is not None:
        from transformers.quantizers import AutoHfQuantizer

        quantizer = AutoHfQuantizer.from_config(quantization, pre_quantized=False)
        quantizer.preprocess_model(model, device_map=None)
        quantizer.postprocess_model(model)
    return trainable_model(model, recipe)


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameters; a packed 4-bit tensor holds two weights per stored byte, and a ZeRO-3
    partitioned one keeps its full size in ``ds_numel``."""
    trainable = total = 0
    for parameter in model.parameters():
        count = getattr(parameter, "ds_numel", parameter.numel())
        count *= 2 if parameter.__class__.__name__ == "Params4bit" else 1
        total += count
        trainable += count if parameter.requires_grad else 0
    return trainable, total
