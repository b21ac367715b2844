"""Merge a LoRA adapter into its base model and save a standalone model (no peft needed to load it).

The base is loaded unquantised in the recipe's dtype even for QLoRA: merging into 4-bit weights
would round the update away, and a merged model is meant to be served or quantised afresh.

The merged folder is tuner's whole: it is saved into a fresh hidden sibling, its manifest (``tuner_files.json``:
each file saved there, its size and SHA-256) is written last, and the folder is swapped into place.  ``--force``
replaces an existing folder only when it holds nothing but the files its manifest proves tuner saved.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from tuner.fileio import DestinationRefused, check_destination, staged_directory
from tuner.loading.model import ModelLoadError, is_image_text, load_model, load_processor, load_tokenizer
from tuner.reason import library_words
from tuner.recipe.schema import Recipe
from tuner.rundir.layout import CHECKPOINTS_DIR, FINAL_DIR, LOCK_FILE
from tuner.rundir.manifest import check_owned, record_files


def find_adapter(run: Path) -> Path:
    """The adapter folder of a run directory (its final/), or ``run`` itself when it holds an adapter."""
    for candidate in (run, run / FINAL_DIR):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise ModelLoadError(f"{run}: no LoRA adapter here (no adapter_config.json in it or in its final/ folder); "
                         "merge takes the run directory of a lora/qlora run, or one of its checkpoints.")


def run_of(adapter: Path) -> Path:
    """The run directory an adapter belongs to (``final/`` or ``checkpoints/checkpoint-N`` of a run), or the adapter
    folder itself when it stands alone."""
    if adapter.name == FINAL_DIR:
        return adapter.parent
    if adapter.parent.name == CHECKPOINTS_DIR:
        return adapter.parent.parent
    return adapter


def check_merge_output(output: Path, adapter: Path, force: bool) -> None:
    """Refuse, before the model is loaded, an output that is not tuner's to write: the run (or a folder holding it),
    its final model or checkpoints, the current folder, a link, a folder with files tuner did not save there;
    an existing merged folder without ``force``."""
    run = run_of(adapter)
    try:
        check_destination(output, holding=[(run, f"the run {run}"), (adapter, f"the adapter {adapter}")],
                          inside=[(run / FINAL_DIR, f"the run's final model {run / FINAL_DIR}"),
                                  (run / CHECKPOINTS_DIR, f"the run's checkpoints {run / CHECKPOINTS_DIR}")])
        check_owned(output)
    except DestinationRefused as exc:
        raise ModelLoadError(str(exc)) from None
    if output.is_dir() and any(output.iterdir()) and not force:
        raise ModelLoadError(f"{output}: already exists; pass --force to replace it, or choose another --output.")


def merged_model(recipe: Recipe, adapter: Path):
    """(model, tokenizer): the unquantised base model in the recipe's dtype with the adapter at ``adapter`` merged in,
    and the adapter's tokenizer; what ``tuner merge`` saves and ``tuner export`` converts."""
    from peft import PeftModel

    unquantised = recipe.model_copy(deep=True)
    unquantised.method.quantization = None
    base = load_model(unquantised)
    try:
        model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    except Exception as exc:  # a damaged or mismatched adapter, whatever peft raises for it
        reason = library_words(exc, 500)
        raise ModelLoadError(f"{adapter}: cannot apply the adapter to its base model ({type(exc).__name__}: "
                             f"{reason}).") from None
    model.config.use_cache = True
    return model, load_tokenizer(recipe, str(adapter))


def merge_adapter(recipe: Recipe, adapter: Path, output: Path, force: bool = False) -> Path:
    """Load the base model, apply the adapter at ``adapter``, merge, and save model, tokenizer and lock at ``output``;
    for an image-text model its whole processor (image processor, tokenizer, chat template), without which the
    merged model could read no image."""
    check_merge_output(output, adapter, force)
    with staged_directory(output, existing="replace") as staging:  # first: an unwritable place fails at once
        model, tokenizer = merged_model(recipe, adapter)
        model.save_pretrained(staging)
        image_text = is_image_text(model.config.to_dict())
        (load_processor(recipe, str(adapter)) if image_text else tokenizer).save_pretrained(staging)
        lock = adapter / LOCK_FILE
        if lock.is_file():
            shutil.copyfile(lock, staging / LOCK_FILE)
        record_files(staging, sorted(entry.name for entry in staging.iterdir()), "tuner merge")
    return output
