"""The doctor's checks of the machine around the GPUs: a leftover Accelerate config, disk, /dev/shm, host RAM,
and the recipe's model on disk."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from tuner.check import Check
from tuner.doctor.gpu import plan_or_none
from tuner.planner.items import GIB
from tuner.recipe.schema import Recipe
from tuner.reason import library_words


def accelerate_default_config() -> Path | None:
    """The config plain ``accelerate launch`` reads when given none (``accelerate config`` writes it).

    Accelerate resolves this once at import (accelerate/commands/config/config_args.py); it is
    resolved here from the environment at call time so the answer matches what a launch would see.
    """
    cache = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    directory = Path(cache).expanduser() / "accelerate"
    for name in ("default_config.yaml", "default_config.json"):
        if (directory / name).is_file():
            return directory / name
    return None


def check_accelerate_config(recipe: Recipe | None) -> Check:
    leftovers = accelerate_default_config()
    env = sorted(name for name in os.environ if name.startswith("ACCELERATE_"))
    if env:
        return Check("accelerate", "warn", f"environment sets {', '.join(env)}, which can change how ranks start",
                     f"unset {' '.join(env)} unless you mean it")
    if leftovers:
        return Check("accelerate", "warn",
                     f"a default config exists at {leftovers}; tuner passes --config_file, but any plain "
                     "`accelerate launch` (and tools that call it) will silently use it",
                     f"remove it if it is a leftover: rm {leftovers}")
    return Check("accelerate", "ok", "no default config or ACCELERATE_* variables to interfere")


def check_disk(recipe: Recipe | None) -> Check:
    """Room for the run's checkpoints (sized from its plan) on the output disk."""
    from tuner.free_space import disk_room

    return disk_room(recipe, plan_or_none(recipe) if recipe is not None else None)


def check_shared_memory(recipe: Recipe | None) -> Check:
    """Containers often mount a 64 MiB /dev/shm; NCCL and data-loader workers then die with SIGBUS."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return Check("shared memory", "ok", "no /dev/shm on this system")
    size = shutil.disk_usage(shm).total / GIB
    detail = f"/dev/shm {size:.1f} GiB"
    if size >= 1:
        return Check("shared memory", "ok", detail)
    multi_gpu = recipe is not None and recipe.uses_gpu and recipe.world_size > 1
    return Check("shared memory", "fail" if multi_gpu else "warn",
                 f"{detail}: NCCL and data-loader workers need more (they die with SIGBUS)",
                 "run the container with --shm-size=16g (or --ipc=host)")


def planned_host_ram_gib(recipe: Recipe) -> float:
    """Host RAM the memory plan needs (offload, loading)."""
    from tuner.planner import plan

    return float(plan(recipe).host_ram_gib)


def check_host_ram(recipe: Recipe | None) -> Check:
    import psutil

    memory = psutil.virtual_memory()
    total, available = memory.total / GIB, memory.available / GIB
    detail = f"{total:.0f} GiB total, {available:.0f} GiB available"
    if recipe is None:
        return Check("host RAM", "ok", detail)
    declared = recipe.hardware.host_ram_gb
    try:
        needed = planned_host_ram_gib(recipe)
    except Exception as exc:  # the planner refuses a recipe that cannot fit: `tuner plan` explains why
        return Check("host RAM", "warn", f"{detail}; no memory plan: {library_words(exc)}", "run tuner plan RECIPE")
    if needed > total:
        return Check("host RAM", "fail", f"{detail}; the plan needs {needed:.0f} GiB",
                     "offload less (memory.offload_optimizer/offload_params), or use nvme offload")
    elif needed > available:
        return Check("host RAM", "warn", f"{detail}; the plan needs {needed:.0f} GiB",
                     "stop other processes using memory before the run")
    else:
        detail += f"; the plan needs {needed:.0f} GiB"
    if declared is not None and declared > total + 1:
        return Check("host RAM", "warn", f"{detail}; hardware.host_ram_gb says {declared:g} GiB",
                     f"set hardware.host_ram_gb: {total:.0f} so the plan is made for this machine")
    return Check("host RAM", "ok", detail)


def check_model(recipe: Recipe | None) -> Check:
    """The recipe's model is on disk (or in the hub cache) before any process starts loading it."""
    if recipe is None:
        return Check("model", "ok", "no recipe given")
    from tuner.catalog.demo import is_builtin
    from tuner.loading.model import ModelLoadError, resolve_model_path

    model_id = recipe.model.id
    try:
        source = resolve_model_path(model_id) if not is_builtin(model_id) else None
    except ModelLoadError as exc:
        return Check("model", "fail", str(exc), "fix model.id")
    if is_builtin(model_id):
        return Check("model", "ok", f"{model_id} (built locally on first use)")
    if Path(source).is_dir():
        return Check("model", "ok", f"{model_id}: local directory with config.json")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(model_id, "config.json", revision=recipe.model.revision)
    if isinstance(cached, str):
        return Check("model", "ok", f"{model_id}: in the local Hugging Face cache")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if offline:
        return Check("model", "fail", f"{model_id}: not in the local cache and HF_HUB_OFFLINE is set",
                     f"hf download {model_id} where there is network, or point model.id at a local directory")
    return Check("model", "warn", f"{model_id}: not cached yet; `tuner run` downloads it once before any rank "
                 "starts (launch.sh N on each machine, before its rendezvous)",
                 f"hf download {model_id} now, so the download does not wait for the launch")
