"""Build a model and tokenizer from a recipe: path, dtype, attention kernel, quantisation, adapters.

Training and inference both load through here, so a model behaves the same in both.
torch and transformers are imported inside functions: the core stays import-light.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from tuner.builtin.model import builtin_model_path, is_builtin
from tuner.recipe.schema import Recipe

log = logging.getLogger("tuner")


class ModelLoadError(Exception):
    """The model cannot be loaded; the message says what to do."""


def resolve_model_path(model_id: str) -> str:
    """A local directory for built-in and local models; the hub id unchanged otherwise."""
    if is_builtin(model_id):
        return str(builtin_model_path(model_id))
    path = Path(model_id).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model.id: {model_id}: the directory has no config.json; point at a saved "
                                 "Hugging Face model (the folder save_pretrained wrote).")
        return str(path)
    return model_id


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def choose_attention(requested: str) -> tuple[str, str]:
    """The attention implementation to load with, and why (logged, never silent)."""
    import torch

    flash_installed = importlib.util.find_spec("flash_attn") is not None
    cuda_ok = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8
    if requested == "eager":
        return "eager", "eager attention requested (stores the full score matrix)"
    if requested == "sdpa":
        return "sdpa", "sdpa attention requested"
    if flash_installed and cuda_ok:
        return "flash_attention_2", "flash-attn is installed and the GPU supports it"
    reason = "flash-attn is not installed" if not flash_installed else "flash-attn needs an Ampere or newer CUDA GPU"
    if requested == "flash":
        return "sdpa", f"flash attention requested but {reason}; falling back to sdpa"
    return "sdpa", f"{reason}; using sdpa"


def load_tokenizer(recipe: Recipe, path: str | None = None):
    from transformers import AutoTokenizer

    source = path or resolve_model_path(recipe.model.id)
    tokenizer = AutoTokenizer.from_pretrained(
        source, revision=recipe.model.revision, trust_remote_code=recipe.model.trust_remote_code)
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


def load_model(recipe: Recipe, path: str | None = None, **kwargs):
    """The base model as the recipe describes it (no adapters yet); ``kwargs`` add to or replace the
    ``from_pretrained`` arguments (inference passes device_map, max_memory and its own quantisation config)."""
    from transformers import AutoModelForCausalLM

    source = path or resolve_model_path(recipe.model.id)
    attention, reason = choose_attention(recipe.memory.attention)
    log.info("attention: %s (%s)", attention, reason)
    arguments = dict(
        revision=recipe.model.revision,
        dtype=torch_dtype(recipe.model.dtype),
        attn_implementation=attention,
        quantization_config=quantization_config(recipe),
        trust_remote_code=recipe.model.trust_remote_code,
    )
    try:
        return AutoModelForCausalLM.from_pretrained(source, **{**arguments, **kwargs})
    except OSError as exc:
        raise ModelLoadError(
            f"model.id: cannot load {recipe.model.id!r}: {exc}. Offline, a hub model loads only from the local "
            "cache; download it first or point model.id at a local directory."
        ) from None


def apply_lora(model, recipe: Recipe):
    """Wrap the model with LoRA adapters (after k-bit preparation for qlora); log the trainable count."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if recipe.method.kind == "qlora":
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=recipe.memory.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    lora = recipe.method.lora
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    log.info("trainable parameters: %d of %d (%.2f%%)", trainable, total, 100 * trainable / max(total, 1))
    return model
