"""Merge a LoRA adapter into its base model and save a standalone model (no peft needed to load it).

The base is loaded unquantised in the recipe's dtype even for QLoRA: merging into 4-bit weights
would round the update away, and a merged model is meant to be served or quantised afresh.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tuner.loading.model import ModelLoadError, load_model, load_tokenizer
from tuner.recipe.schema import Recipe
from tuner.run_layout import FINAL_DIR, LOCK_FILE


def find_adapter(run: Path) -> Path:
    """The adapter folder of a run directory (its final/), or ``run`` itself when it holds an adapter."""
    for candidate in (run, run / FINAL_DIR):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise ModelLoadError(f"{run}: no LoRA adapter here (no adapter_config.json in it or in its final/ folder); "
                         "merge takes the run directory of a lora/qlora run, or one of its checkpoints.")


def merge_adapter(recipe: Recipe, adapter: Path, output: Path, force: bool = False) -> Path:
    """Load the base model, apply the adapter at ``adapter``, merge, and save model, tokenizer and lock at ``output``."""
    from peft import PeftModel

    if output.exists() and any(output.iterdir()) and not force:
        raise ModelLoadError(f"{output}: already exists; pass --force to replace it, or choose another --output.")
    unquantised = recipe.model_copy(deep=True)
    unquantised.method.quantization = None
    model = PeftModel.from_pretrained(load_model(unquantised), str(adapter)).merge_and_unload()
    model.config.use_cache = True
    tokenizer = load_tokenizer(recipe, str(adapter))
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}-", dir=output.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        lock = adapter / LOCK_FILE
        if lock.is_file():
            shutil.copyfile(lock, staging / LOCK_FILE)
        if output.exists():
            shutil.rmtree(output)
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output
