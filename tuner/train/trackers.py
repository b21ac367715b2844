"""Experiment trackers through the Trainer's own integrations (``training.report_to``), writing under the run directory.

Each chosen tracker is pointed at the run directory through its own environment variables, and only where the user
has not set them: a user's ``MLFLOW_TRACKING_URI``, ``WANDB_MODE=online`` or ``TRACKIO_DIR`` wins.

- tensorboard: event files in ``<run>/tensorboard`` (``TENSORBOARD_LOGGING_DIR``).
- mlflow: MLflow's local file store in ``<run>/mlruns`` (``MLFLOW_TRACKING_URI``; MLflow 3 keeps the file store only
  when ``MLFLOW_ALLOW_FILE_STORE`` is set), one experiment per recipe name.
- wandb: offline mode (``WANDB_MODE=offline``), runs in ``<run>/wandb``; ``wandb sync`` uploads them later.
- trackio: its local database in ``<run>/trackio`` (``TRACKIO_DIR``), no Space.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Mapping

from tuner.recipe.schema import Recipe
from tuner.rundir.layout import MLFLOW_DIR, TENSORBOARD_DIR, TRACKIO_DIR


def tracker_environment(recipe: Recipe, run_dir: Path, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables to add to ``environ`` so each chosen tracker writes under ``run_dir``; none the user has set."""
    run_dir = run_dir.resolve()
    chosen = recipe.training.report_to
    wanted: dict[str, str] = {}
    if "tensorboard" in chosen:
        wanted["TENSORBOARD_LOGGING_DIR"] = str(run_dir / TENSORBOARD_DIR)
    if "mlflow" in chosen:
        if "MLFLOW_TRACKING_URI" not in environ:
            wanted.update(MLFLOW_TRACKING_URI=(run_dir / MLFLOW_DIR).as_uri(), MLFLOW_ALLOW_FILE_STORE="true")
        wanted["MLFLOW_EXPERIMENT_NAME"] = recipe.name
    if "wandb" in chosen:
        wanted.update(WANDB_MODE="offline", WANDB_DIR=str(run_dir), WANDB_PROJECT=recipe.name)
    if "trackio" in chosen:
        wanted["TRACKIO_DIR"] = str(run_dir / TRACKIO_DIR)
    return {name: value for name, value in wanted.items() if name not in environ}


def configure_trackers(recipe: Recipe, run_dir: Path) -> None:
    """Refuse a tracker that is not installed (before the model is built), then point the others at ``run_dir``."""
    from tuner.doctor.libraries import require_trackers

    require_trackers(recipe)
    os.environ.update(tracker_environment(recipe, run_dir))


def tracker_arguments(arguments_class, recipe: Recipe, run_dir: Path) -> dict:
    """``TrainingArguments`` for the chosen trackers: ``report_to``, the run's name, and TensorBoard's folder where
    this transformers release still takes it as ``logging_dir`` (before 5.x; later ones read the environment)."""
    names = {field.name for field in dataclasses.fields(arguments_class)}
    arguments = {"report_to": list(recipe.training.report_to) or "none", "run_name": recipe.name}
    if "project" in names:  # trackio's project
        arguments["project"] = recipe.name
    if "logging_dir" in names:
        arguments["logging_dir"] = os.environ.get("TENSORBOARD_LOGGING_DIR", str(run_dir.resolve() / TENSORBOARD_DIR))
    return arguments
