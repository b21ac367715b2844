"""The GPU side of the doctor: torch's build, the visible GPUs against the recipe's plan, bf16 and NCCL."""
from __future__ import annotations

import os
from dataclasses import dataclass

from tuner.check import Check, Status
from tuner.planner.items import GIB
from tuner.recipe.schema import Recipe


def _needs_gpu(recipe: Recipe | None) -> bool:
    return recipe is not None and recipe.uses_gpu


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


def plan_or_none(recipe: Recipe):
    """The recipe's memory plan; None where the planner cannot plan it (check_model says why)."""
    try:
        from tuner.planner import plan

        return plan(recipe)
    except Exception:
        return None


def _planned_peak_gib(recipe: Recipe) -> float | None:
    """Peak GPU memory of the recipe's plan."""
    planned = plan_or_none(recipe)
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
