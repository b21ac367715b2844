"""A run directory: every file a launch needs, rendered from one recipe and written atomically."""
from __future__ import annotations

from pathlib import Path

from tuner.fileio import atomic_write_directory, atomic_write_text
from tuner.recipe.io import RecipeError, recipe_to_yaml, with_output_dir
from tuner.recipe.schema import Recipe
from tuner.render.accelerate_config import render_accelerate_config
from tuner.render.deepspeed_config import render_deepspeed_config
from tuner.render.launch_script import render_launch_script, render_slurm_script
from tuner.run_layout import ACCELERATE_CONFIG, DEEPSPEED_CONFIG, EVENTS_FILE, LAUNCH_SCRIPT, LOCK_FILE, SLURM_SCRIPT

EXECUTABLES = (LAUNCH_SCRIPT, SLURM_SCRIPT)


def render_run_files(recipe: Recipe, run_dir: str | Path | None = None) -> dict[str, str]:
    """File name -> text for the run directory (what the Review screen shows and ``tuner render`` writes)."""
    if run_dir is not None:  # the lock names the directory the files are written to (`tuner render -o DIR`)
        recipe = with_output_dir(recipe, run_dir)
    run_dir = Path(recipe.output.dir)
    mem = recipe.memory
    deepspeed_file = str(run_dir / DEEPSPEED_CONFIG) if mem.distributed == "deepspeed" else None
    layer_classes = None
    if mem.distributed == "fsdp":
        from tuner.render.model_layers import decoder_layer_classes

        layer_classes = decoder_layer_classes(recipe.model)
    files = {
        LOCK_FILE: recipe_to_yaml(recipe),
        ACCELERATE_CONFIG: render_accelerate_config(recipe, deepspeed_file, layer_classes),
    }
    if deepspeed_file:
        files[DEEPSPEED_CONFIG] = render_deepspeed_config(recipe)
    files[LAUNCH_SCRIPT] = render_launch_script(recipe, run_dir)
    if recipe.uses_gpu:
        files[SLURM_SCRIPT] = render_slurm_script(recipe, run_dir)
    return files


def write_run_directory(recipe: Recipe, run_dir: str | Path | None = None, *, force: bool = False,
                        keep_existing: bool = False) -> Path:
    """Write the run files; refuse to touch an existing run directory unless ``force`` or ``keep_existing``
    (resume: the directory and its checkpoints are the point)."""
    run_dir = Path(run_dir or recipe.output.dir)
    if run_dir.exists() and any(run_dir.iterdir()) and not (force or keep_existing):
        raise RecipeError([f"{run_dir}: the run directory already exists; pass --force to overwrite its files, "
                           "--resume to continue it, or change output.dir."])
    files = render_run_files(recipe, run_dir)
    modes = {name: 0o755 for name in EXECUTABLES}
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return atomic_write_directory(run_dir, files, modes)  # whole or not at all: a full disk leaves no half run
    if force:
        # a fresh run: its progress must not show the old one's, nor its files outlive a change of topology
        for stale in (EVENTS_FILE, DEEPSPEED_CONFIG, SLURM_SCRIPT):
            if stale not in files:
                (run_dir / stale).unlink(missing_ok=True)
    for name, text in files.items():
        atomic_write_text(run_dir / name, text, mode=modes.get(name))
    return run_dir
