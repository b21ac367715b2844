"""What to run: a recipe, a tuner run directory, or an ad hoc model, resolved to paths and a recipe.

A run directory is first-class: ``runs/<name>`` holds ``recipe.lock.yaml`` and ``final/`` with either a
full (or merged) model or a LoRA adapter; an adapter is loaded on the base model its lock file names.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from tuner.fileio import user_path
from tuner.loading.model import ModelLoadError, resolve_model_path
from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.overrides import apply_overrides
from tuner.recipe.registry import resolve_recipe_argument
from tuner.recipe.schema import Recipe
from tuner.recipe.source import RecipeSource
from tuner.rundir.layout import FINAL_DIR, LOCK_FILE, OFFLOAD_DIR

ADAPTER_CONFIG = "adapter_config.json"
MODEL_CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass(frozen=True)
class InferenceTarget:
    recipe: Recipe
    model_path: str
    tokenizer_path: str
    adapter: Path | None = None
    run_dir: Path | None = None
    use_recipe_hardware: bool = True
    # model.dtype comes from a run's lock file, which states every default: the dtype training derived from
    # its mixed precision, not one chosen for inference (a --set model.dtype=... is chosen)
    dtype_from_training: bool = False

    @property
    def dtype_chosen(self) -> bool:
        """Whether the recipe or a --set names model.dtype, rather than it following memory.mixed_precision."""
        return "dtype" in self.recipe.model.model_fields_set and not self.dtype_from_training

    @property
    def offload_folder(self) -> Path | None:
        """inference.offload_folder, else <run dir>/offload; None means a temporary folder."""
        configured = self.recipe.inference.offload_folder
        if configured:
            return user_path(configured)
        return self.run_dir / OFFLOAD_DIR if self.run_dir else None

    def describe(self) -> str:
        adapter = f" + adapter {self.adapter}" if self.adapter else ""
        return f"{self.model_path}{adapter}"


def saved_result(directory: Path) -> Path | None:
    """The folder holding a trained result inside a run directory (``final/``), or the folder itself."""
    for candidate in (directory / FINAL_DIR, directory):
        if (candidate / MODEL_CONFIG).is_file() or (candidate / ADAPTER_CONFIG).is_file():
            return candidate
    return None


def is_run_directory(path: Path) -> bool:
    return path.is_dir() and ((path / LOCK_FILE).is_file() or (path / FINAL_DIR / LOCK_FILE).is_file())


def _adapter_dir(argument: str) -> Path:
    path = user_path(argument)
    found = saved_result(path) if path.is_dir() else None
    if found is None or not (found / ADAPTER_CONFIG).is_file():
        raise ModelLoadError(f"--adapter {argument}: no {ADAPTER_CONFIG} there (or in its {FINAL_DIR}/); point at a "
                             "LoRA adapter folder or a tuner run directory trained with method.kind lora/qlora.")
    return found


def _run_directory_target(run_dir: Path, overrides: list[str]) -> InferenceTarget:
    final = saved_result(run_dir)
    if final is None:
        raise ModelLoadError(f"{run_dir}: the run has no {FINAL_DIR}/ model yet (training has not finished); "
                             "wait for it, "
                             f"or pass --model with one of its checkpoints/ folders.")
    lock = final / LOCK_FILE if (final / LOCK_FILE).is_file() else run_dir / LOCK_FILE
    recipe = load_recipe(lock, overrides)
    run_dir = final.parent if final.name == FINAL_DIR else final
    tokenizer = str(final) if (final / TOKENIZER_CONFIG).is_file() else None
    from_training = not any(override.split("=", 1)[0].strip() == "model.dtype" for override in overrides)
    if (final / ADAPTER_CONFIG).is_file():
        base = resolve_model_path(recipe.model.id)
        return InferenceTarget(recipe, base, tokenizer or base, adapter=final, run_dir=run_dir,
                               dtype_from_training=from_training)
    return InferenceTarget(recipe, str(final), tokenizer or str(final), run_dir=run_dir,
                           dtype_from_training=from_training)


def check_saved_files(target: InferenceTarget) -> None:
    """Refuse, before anything loads, a local model, adapter or tokenizer folder with a damaged file, naming it
    (:func:`tuner.rundir.integrity.saved_model_problem`): transformers would fail somewhere inside, or not at all."""
    from tuner.rundir.integrity import saved_model_problem

    folders = dict.fromkeys(Path(path) for path in (target.model_path, target.adapter, target.tokenizer_path)
                            if path is not None and Path(path).is_dir())
    for folder in folders:
        problem = saved_model_problem(folder)
        if problem:
            what = "the run's saved model" if target.run_dir is not None and folder.parent == target.run_dir else "it"
            raise ModelLoadError(f"{folder}/{problem}; {what} cannot be loaded. Restore the file, or load another "
                                 "folder (a run's checkpoints/checkpoint-N holds an earlier save).")


def resolve_target(argument: str | None = None, overrides: Iterable[str] = (), model: str | None = None,
                   adapter: str | None = None, show_download: bool = True) -> InferenceTarget:
    """Resolve ``RECIPE | RUN_DIR | --model`` (+ ``--adapter``) to what :func:`load_for_inference` loads; a hub model
    is downloaded here, said on stderr with a progress bar unless ``show_download`` is off (the wizard).

    ``--model`` replaces the model of a recipe (or stands alone with the schema's defaults, placing it on
    every visible GPU); ``--adapter`` adds a LoRA adapter to whatever base model results.
    """
    overrides = list(overrides)
    if argument is None and model is None:
        raise ModelLoadError("nothing to run: give a recipe, a run directory (runs/<name>) or --model PATH_OR_ID.")
    if argument is not None and is_run_directory(Path(argument)):
        target = _run_directory_target(Path(argument), overrides)
        if model:
            target = replace(target, model_path=resolve_model_path(model), tokenizer_path=resolve_model_path(model))
    elif argument is not None:
        recipe = load_recipe(resolve_recipe_argument(argument), overrides)
        if model:
            recipe.model.id = model
        path = resolve_model_path(recipe.model.id)
        target = InferenceTarget(recipe, path, path)
    else:
        source = RecipeSource(path="--model")
        recipe = validate_recipe(apply_overrides({"model": {"id": model}}, overrides, source), source)
        path = resolve_model_path(recipe.model.id)
        target = InferenceTarget(recipe, path, path, use_recipe_hardware=False)
    if adapter:
        found = _adapter_dir(adapter)
        tokenizer = str(found) if (found / TOKENIZER_CONFIG).is_file() else target.tokenizer_path
        target = replace(target, tokenizer_path=tokenizer, adapter=found)
    target = _downloaded(target, show_download)
    check_saved_files(target)
    return target


def _downloaded(target: InferenceTarget, shown: bool) -> InferenceTarget:
    """A hub model downloaded once, with a progress bar, before anything loads it (refused before the first byte
    when the Hugging Face cache's disk lacks room); its snapshot folder replaces the hub id."""
    import sys

    from tuner.catalog.hub import HubError
    from tuner.free_space import check_download_room
    from tuner.loading.hub_download import download, plan_download

    model = target.recipe.model
    planned = plan_download(target.model_path, model.revision, model.trust_remote_code)
    if planned is None:
        return target
    room = check_download_room(planned)
    if room.status == "fail":
        raise HubError(f"{planned.describe()}: refused, {room.detail}; {room.fix}.")
    if shown:
        print(planned.describe(), file=sys.stderr, flush=True)
    local = str(download(planned, progress=shown))
    tokenizer = local if target.tokenizer_path == target.model_path else target.tokenizer_path
    return replace(target, model_path=local, tokenizer_path=tokenizer)
