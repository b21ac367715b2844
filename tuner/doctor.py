"""Environment checks before a run burns GPU hours: one function per check, each returning a :class:`Check`.

A check is ``fail`` only when the given recipe needs what is missing (or when tuner cannot work at all);
without a recipe, missing optional pieces are ``warn``.  Heavy libraries are imported inside the checks,
and a check that crashes is reported as a failed check, never as a traceback.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuner.check import Check, Status
from tuner.planner.items import GIB
from tuner.recipe.schema import Recipe
from tuner.reason import library_words



@contextlib.contextmanager
def _quiet():
    """Some libraries print banners while importing (DeepSpeed's accelerator guess, bitsandbytes' kernels
    notice); doctor's output is its lines only."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def _needs_gpu(recipe: Recipe | None) -> bool:
    return recipe is not None and recipe.uses_gpu


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Gpu:
    name: str
    total_gib: float
    free_gib: float  # what other processes on a shared machine leave


def _cuda_gpus() -> list[Gpu]:
    """Every visible CUDA GPU; empty without one."""
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        gpus.append(Gpu(torch.cuda.get_device_name(index), total / GIB, free / GIB))
    return gpus


# -- the checks ------------------------------------------------------------------------------------------------

def check_torch(recipe: Recipe | None) -> Check:
    try:
        import torch
    except ImportError as exc:
        return Check("torch", "fail", f"cannot import torch: {exc}", "install torch: make install (see README)")
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else ("ROCm " + torch.version.hip if torch.version.hip else "CPU build")
    if _needs_gpu(recipe) and not (torch.version.cuda or torch.version.hip):
        return Check("torch", "fail", f"torch {torch.__version__} is a CPU build; the recipe needs GPUs",
                     "install a CUDA build of torch (pip install torch --index-url https://download.pytorch.org/whl/cu126)")
    return Check("torch", "ok", f"torch {torch.__version__} ({build})")


def check_gpus(recipe: Recipe | None) -> Check:
    gpus = _cuda_gpus()
    if not gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        fix = "check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES" if _needs_gpu(recipe) else \
            "none needed for CPU recipes; for GPU training check nvidia-smi and the driver"
        return Check("gpus", "fail" if _needs_gpu(recipe) else "warn", f"no CUDA GPU{hint}", fix)
    detail = f"{len(gpus)} GPU(s): " + ", ".join(f"{gpu.name} {gpu.free_gib:.0f}/{gpu.total_gib:.0f} GiB free" for gpu in gpus)
    busy = [index for index, gpu in enumerate(gpus) if gpu.free_gib < 0.9 * gpu.total_gib]
    if recipe is not None and recipe.uses_gpu:
        wanted = recipe.hardware.gpus_per_machine
        if len(gpus) < wanted:
            return Check("gpus", "fail", f"{detail}; the recipe wants {wanted} per machine",
                         f"set hardware.gpus_per_machine: {len(gpus)}, or run where {wanted} are visible")
        planned = _planned_gpu_memory_gib(recipe)
        smallest = min(gpu.total_gib for gpu in gpus)
        if planned is not None and smallest < planned - 0.5:
            return Check("gpus", "fail", f"{detail}; the plan assumes {planned:.0f} GiB per GPU",
                         f"set hardware.gpu_memory_gb: {smallest:.0f} (or the matching hardware.gpu) and re-plan")
        needed = _planned_peak_gib(recipe)
        short = [index for index, gpu in enumerate(gpus[:wanted]) if needed is not None and gpu.free_gib < needed]
        if short:
            return Check("gpus", "fail", f"{detail}; the plan peaks at {needed:.0f} GiB but GPU(s) "
                         f"{', '.join(map(str, short))} have less free: other processes hold memory",
                         "wait for them (nvidia-smi shows who), or pick free GPUs with CUDA_VISIBLE_DEVICES")
    if busy:
        return Check("gpus", "warn", f"{detail}; other processes hold memory on GPU(s) {', '.join(map(str, busy))}",
                     "see nvidia-smi; pick free GPUs with CUDA_VISIBLE_DEVICES")
    return Check("gpus", "ok", detail)


def _plan_or_none(recipe: Recipe):
    """The recipe's memory plan; None where the planner cannot plan it (check_model says why)."""
    try:
        from tuner.planner import plan

        return plan(recipe)
    except Exception:
        return None


def _planned_peak_gib(recipe: Recipe) -> float | None:
    """Peak GPU memory of the recipe's plan."""
    planned = _plan_or_none(recipe)
    return planned.gpu.total_gib if planned is not None else None


def _planned_gpu_memory_gib(recipe: Recipe) -> float | None:
    from tuner.catalog.gpus import lookup_gpu

    if recipe.hardware.gpu_memory_gb is not None:
        return recipe.hardware.gpu_memory_gb
    if recipe.hardware.gpu is not None:
        try:
            return lookup_gpu(recipe.hardware.gpu).memory_gib
        except KeyError:
            return None
    return None


def check_bf16(recipe: Recipe | None) -> Check:
    import torch

    wants_bf16 = recipe is not None and recipe.memory.mixed_precision == "bf16"
    if not torch.cuda.is_available():
        return Check("bf16", "ok", "CPU autocast supports bf16" + (" (slow without AMX/AVX512-BF16)" if wants_bf16 else ""))
    if torch.cuda.is_bf16_supported():
        return Check("bf16", "ok", "supported by the GPU")
    status: Status = "fail" if wants_bf16 and recipe.uses_gpu else "warn"
    return Check("bf16", status, "this GPU has no bf16 (pre-Ampere)",
                 "set memory.mixed_precision: fp16 and model.dtype: float16 (or float32)")


def check_bitsandbytes(recipe: Recipe | None) -> Check:
    needed = recipe is not None and recipe.uses_bitsandbytes
    missing: Status = "fail" if needed else "warn"
    try:
        with _quiet():
            import bitsandbytes
            from bitsandbytes import cextension
    except Exception as exc:  # a broken native library raises all sorts of errors at import
        return Check("bitsandbytes", missing, f"cannot import: {library_words(exc)}",
                     "pip install -U bitsandbytes (needed for qlora and 8-bit optimizers)")
    backend = getattr(cextension, "BNB_BACKEND", "unknown")
    if isinstance(getattr(cextension, "lib", None), getattr(cextension, "ErrorHandlerMockBNBNativeLibrary", ())):
        return Check("bitsandbytes", missing, f"{bitsandbytes.__version__}: the {backend} native library did not load",
                     "reinstall bitsandbytes for this torch/CUDA: pip install --force-reinstall bitsandbytes")
    if needed and recipe.uses_gpu and backend == "CPU":
        return Check("bitsandbytes", "fail", f"{bitsandbytes.__version__} with the CPU backend; the recipe quantises on GPUs",
                     "install a CUDA build of torch, then reinstall bitsandbytes")
    return Check("bitsandbytes", "ok", f"{bitsandbytes.__version__} ({backend} backend)")


def _import_check(name: str, module: str, distribution: str, needed: bool, purpose: str, install: str) -> Check:
    """An optional CUDA extension: absent is fine unless needed; present but broken is always worth a line."""
    if importlib.util.find_spec(module) is None:
        status: Status = "fail" if needed else "warn"
        return Check(name, status, f"not installed ({purpose})", install)
    try:
        with _quiet():
            importlib.import_module(module)
    except Exception as exc:  # undefined symbols: built for another torch or CUDA
        first = library_words(exc)
        return Check(name, "fail", f"{_version(distribution) or 'installed'} but cannot import: {first}",
                     f"rebuild it for this torch: pip install --force-reinstall --no-build-isolation {distribution}")
    return Check(name, "ok", f"{_version(distribution) or 'installed'} imports with this torch")


def check_flash_attn(recipe: Recipe | None) -> Check:
    needed = recipe is not None and recipe.memory.attention == "flash" and recipe.uses_gpu
    return _import_check("flash-attn", "flash_attn", "flash-attn", needed, "attention falls back to sdpa",
                         "pip install flash-attn --no-build-isolation (CUDA GPUs only), or set memory.attention: sdpa")


def check_vllm(recipe: Recipe | None) -> Check:
    """vLLM for grpo's vllm_colocate/vllm_server generation: installed, and a version TRL supports (TRL's own check,
    whose warning names its range)."""
    import warnings

    grpo = recipe.objective.grpo if recipe is not None else None
    needed = grpo is not None and grpo.generation != "transformers"
    install = "pip install vllm (a version TRL supports, on the GPU machines), or set objective.grpo.generation: " \
              "transformers"
    version = _version("vllm")
    if version is None:
        why = f"objective.grpo.generation: {grpo.generation} needs it" if needed else \
            "only grpo's vLLM generation uses it"
        return Check("vllm", "fail" if needed else "ok", f"not installed ({why})", install if needed else "")
    from trl.import_utils import is_vllm_available

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        is_vllm_available()
    unsupported = next((str(warning.message) for warning in caught if "vLLM versions" in str(warning.message)), None)
    if unsupported:
        return Check("vllm", "fail" if needed else "warn", unsupported.split(" We recommend")[0], install)
    return Check("vllm", "ok", f"vllm {version}, within TRL's supported range")


def check_liger(recipe: Recipe | None) -> Check:
    needed = recipe is not None and recipe.memory.liger
    return _import_check("liger-kernel", "liger_kernel", "liger-kernel", needed, "fused kernels unavailable",
                         "pip install liger-kernel, or set memory.liger: false")


def _model_type(recipe: Recipe | None) -> str | None:
    from tuner.catalog.models import UnknownModelError, model_facts

    if recipe is None:
        return None
    try:
        return model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code).model_type
    except UnknownModelError:  # check_model says why; the kernels are then told without the model's class
        return None


def machine_kernels(recipe: Recipe | None) -> dict[str, str]:
    """The kernels this machine will use for ``recipe`` (or in general, without one): attention, Liger, and how
    TRL's fused log-prob head folds its tiles (dpo/kto) -- each with the loader's own reason."""
    import torch
    from transformers.utils import is_triton_available

    from tuner.loading.model import choose_attention, choose_liger

    model_type, cuda = _model_type(recipe), torch.cuda.is_available()
    attention, why = choose_attention(recipe.memory.attention if recipe else "auto", model_type)
    liger, liger_why = choose_liger(recipe.memory.liger if recipe else True, model_type or "llama",
                                    cuda and (recipe is None or recipe.uses_gpu))
    fold = "triton (TRL's Triton kernel on this GPU)" if is_triton_available() and cuda else \
        "torch ops, fp32 tiles (" + ("triton is not installed)" if cuda else "no CUDA GPU)")
    return {"attention": f"{attention} ({why})", "liger": f"on ({liger_why})" if liger else liger_why,
            "trl log-prob fold": fold}


def check_kernels(recipe: Recipe | None) -> Check:
    """Which kernels this machine will use, against the ones the plan assumed (tuner.planner.kernels)."""
    used = machine_kernels(recipe)
    detail = "; ".join(f"{name}: {value}" for name, value in used.items())
    if recipe is None or not recipe.uses_gpu:
        return Check("kernels", "ok", detail)
    from tuner.catalog.models import UnknownModelError, model_facts
    from tuner.planner.kernels import TRITON_FOLD, kernels

    try:
        planned = kernels(recipe, model_facts(recipe.model.id, recipe.model.revision,
                                              recipe.model.trust_remote_code).model_type)
    except UnknownModelError:
        return Check("kernels", "ok", detail)
    differ = []
    if not used["attention"].startswith({"flash": "flash_attention_2"}.get(planned.attention, planned.attention)):
        differ.append(f"attention {planned.attention}")
    if planned.liger != used["liger"].startswith("on"):
        differ.append(f"liger {'on' if planned.liger else 'off'}")
    if recipe.objective.preference and (planned.logprob_fold == TRITON_FOLD) != used["trl log-prob fold"].startswith("triton"):
        differ.append(f"the {planned.logprob_fold} fold of TRL's log-prob head")
    if differ:
        return Check("kernels", "warn", f"{detail}; the plan assumed {', '.join(differ)}",
                     "run tuner plan on this machine: it plans the kernels installed here")
    return Check("kernels", "ok", detail + "; as the plan assumed")


def tracker_installed(tracker: str) -> bool:
    """Whether the Trainer's integration for a tracker can run here (TensorBoard also writes through tensorboardX)."""
    modules = ("tensorboard", "tensorboardX") if tracker == "tensorboard" else (tracker,)
    return any(importlib.util.find_spec(module) is not None for module in modules)


def check_trackers(recipe: Recipe | None) -> Check:
    """Which experiment trackers are installed; fails when ``training.report_to`` names one that is not."""
    from tuner.recipe.schema import TRACKERS

    installed = [tracker for tracker in TRACKERS if tracker_installed(tracker)]
    absent = [tracker for tracker in TRACKERS if tracker not in installed]
    detail = f"installed: {', '.join(installed) or 'none'}" + (f"; not installed: {', '.join(absent)}" if absent else "")
    missing = [tracker for tracker in recipe.training.report_to if tracker in absent] if recipe else []
    if missing:
        return Check("trackers", "fail", f"training.report_to names {', '.join(missing)}, which is not installed "
                     f"({detail})", f"pip install 'tuner[{','.join(missing)}]', or remove it from training.report_to")
    hint = f" (pip install 'tuner[{absent[0]}]' adds one)" if absent else ""
    return Check("trackers", "ok", detail + hint)


def require_trackers(recipe: Recipe) -> None:
    """Before a launch (and again on every rank): a tracker the recipe names must be installed."""
    from tuner.recipe.io import RecipeError

    check = check_trackers(recipe)
    if check.status == "fail":
        raise RecipeError([f"{check.detail}: {check.fix}."])


def _deepspeed_ops_needed(recipe: Recipe | None) -> set[str]:
    if recipe is None or recipe.memory.distributed != "deepspeed":
        return set()
    mem = recipe.memory
    ops = set()
    if "cpu" in (mem.offload_optimizer, mem.offload_params):
        ops.add("cpu_adam")
    if "nvme" in (mem.offload_optimizer, mem.offload_params):
        ops |= {"cpu_adam", "async_io"}
    if recipe.uses_gpu and mem.offload_optimizer == "none":
        ops.add("fused_adam")
    return ops


def check_deepspeed(recipe: Recipe | None) -> Check:
    """ds_report in one line: which ops this machine can build, and whether the recipe's ones are among them."""
    needs_deepspeed = recipe is not None and recipe.memory.distributed == "deepspeed"
    try:
        with _quiet():
            import deepspeed
            from deepspeed.git_version_info import installed_ops
            from deepspeed.ops.op_builder.all_ops import ALL_OPS
            compatible = {name for name, builder in ALL_OPS.items() if builder.is_compatible(verbose=False)}
    except Exception as exc:
        return Check("deepspeed", "fail" if needs_deepspeed else "warn", f"cannot import: {library_words(exc)}",
                     "pip install deepspeed (needed for distributed: deepspeed)")
    prebuilt = {name for name, built in installed_ops.items() if built}
    needed = _deepspeed_ops_needed(recipe)
    detail = f"{deepspeed.__version__}: {len(compatible)}/{len(ALL_OPS)} ops compatible, {len(prebuilt)} prebuilt"
    unavailable = sorted(needed - compatible)
    if unavailable:
        return Check("deepspeed", "fail", f"{detail}; the recipe needs {', '.join(unavailable)}, which cannot build here",
                     "run ds_report for the reason (usually a missing CUDA toolkit or libaio-dev for async_io)")
    jit = sorted(needed - prebuilt)
    if jit and not (shutil.which("ninja") or importlib.util.find_spec("ninja")):
        return Check("deepspeed", "fail", f"{detail}; {', '.join(jit)} must be compiled at first use and ninja is missing",
                     "pip install ninja (and have a C++ compiler), or prebuild: DS_BUILD_OPS=1 pip install deepspeed")
    incompatible = sorted(set(ALL_OPS) - compatible)
    if incompatible:
        detail += f" (not here: {', '.join(incompatible)})"
    return Check("deepspeed", "ok", detail)


def check_nccl(recipe: Recipe | None) -> Check:
    import torch
    import torch.distributed as dist

    multi_gpu = recipe is not None and recipe.uses_gpu and recipe.world_size > 1
    if not torch.cuda.is_available() or not dist.is_available() or not dist.is_nccl_available():
        status: Status = "fail" if multi_gpu else "warn"
        return Check("nccl", status, "NCCL not available (multi-GPU runs need it; CPU runs use gloo)",
                     "install a CUDA build of torch on a machine with NVIDIA GPUs")
    version = ".".join(map(str, torch.cuda.nccl.version()))
    return Check("nccl", "ok", f"NCCL {version}")


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

    return disk_room(recipe, _plan_or_none(recipe) if recipe is not None else None)


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


CHECKS: tuple[Callable[[Recipe | None], Check], ...] = (
    check_torch, check_gpus, check_bf16, check_bitsandbytes, check_flash_attn, check_liger, check_kernels, check_vllm,
    check_deepspeed, check_nccl, check_accelerate_config, check_trackers, check_model, check_disk, check_shared_memory,
    check_host_ram,
)


def run_checks(recipe: Recipe | None = None,
               checks: tuple[Callable[[Recipe | None], Check], ...] = CHECKS) -> list[Check]:
    """Every check, in order; a check that raises is itself a failed check naming the error."""
    results = []
    for check in checks:
        name = check.__name__.removeprefix("check_").replace("_", " ")
        try:
            results.append(check(recipe))
        except Exception as exc:
            results.append(Check(name, "fail", f"the check itself failed: {type(exc).__name__}: {library_words(exc)}",
                                 "report this with the output of `tuner doctor`"))
    return results
