"""Which kernels a run will use, decided before it runs: the attention implementation, Liger's kernels and the fold
of TRL's fused log-prob head (dpo/kto).  Some planner terms hold only where a kernel is used (flash-attention keeps
no mask, Liger's fused loss no logits, TRL's Triton fold no fp32 tiles); the plan asks here which one the run will
get and plans that one, and names every assumption in its notes.

A kernel is used where the recipe's settings allow it (the model class supports flash-attention, 16-bit
activations, a GPU for Triton and Liger) and the training machine has it installed.  What is installed is read on
this machine (``importlib.util.find_spec``: nothing is imported): it is the training machine for CPU recipes, and
for GPU recipes where it has an NVIDIA driver.  A GPU recipe planned elsewhere (a laptop, this project's CPU
machines) assumes the training machines have triton (PyPI's CUDA builds of torch bring it on Linux) and what the
recipe asks for (flash-attn, liger-kernel), and says so; ``tuner doctor`` on a training machine reports which kernels it
will really use.
"""
from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass, field
from pathlib import Path

# memory.attention's values, as the plan counts them: flash keeps no mask, eager the span x span scores
TRITON_FOLD, TORCH_FOLD = "triton", "torch"  # how TRL's fused log-prob head folds each tile (trl.kernels.chunked_logprob)


@dataclass(frozen=True)
class Environment:
    """What the training machines have installed, as far as a plan made here can tell."""

    triton: bool
    flash_attn: bool
    liger: bool
    here: bool  # read on this machine (True) or assumed for training machines elsewhere (False)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver on this machine (read without importing torch): it can train GPU recipes."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def environment(recipe) -> Environment:
    """This machine's packages where it can train ``recipe`` (a CPU recipe; a GPU recipe on an NVIDIA machine),
    else the training machines' as assumed: triton (PyPI's CUDA torch), and the kernels the recipe asks for."""
    if not recipe.uses_gpu or has_nvidia_gpu():
        return Environment(triton=installed("triton"), flash_attn=installed("flash_attn"),
                           liger=installed("liger_kernel"), here=True)
    return Environment(triton=True, flash_attn=recipe.memory.attention == "flash", liger=recipe.memory.liger,
                       here=False)


@dataclass(frozen=True)
class Kernels:
    """The kernels the plan counts for one recipe, and the notes that name each assumption."""

    attention: str  # flash, sdpa or eager
    liger: bool
    logprob_fold: str | None  # TRITON_FOLD or TORCH_FOLD for dpo/kto; None for sft
    notes: tuple[str, ...] = field(default_factory=tuple)


def _flash_problem(recipe, env: Environment) -> str | None:
    """Why flash-attention will not run for ``recipe`` (None when it will): installed, a GPU of Ampere or later
    (bf16 came with it), and 16-bit activations (flash-attn computes in fp16/bf16 only)."""
    from tuner.catalog.gpus import lookup_gpu

    if not recipe.uses_gpu:
        return "flash-attn needs a CUDA GPU"
    if not env.flash_attn:
        return "flash-attn is not installed " + ("on this machine" if env.here else "on the training machines")
    try:
        spec = lookup_gpu(recipe.hardware.gpu) if recipe.hardware.gpu else None
    except KeyError:
        spec = None
    if spec is not None and not spec.bf16:
        return f"flash-attn 2 needs an Ampere or newer GPU, and {spec.name} is older"
    if recipe.memory.mixed_precision == "no" and recipe.model.dtype == "float32":
        return "flash-attn computes in fp16/bf16 only, and this run's activations are fp32 (mixed_precision: no)"
    return None


def kernels(recipe, model_type: str) -> Kernels:
    """The attention, Liger and log-prob kernels ``recipe``'s run will use on its training machines, with notes."""
    from tuner.catalog.model_classes import attention_for, model_class

    env = environment(recipe)
    mem, notes = recipe.memory, []
    cls = model_class(model_type)
    flash_problem = _flash_problem(recipe, env)
    if mem.attention == "auto" and not env.here:
        flash_problem = "the plan does not assume flash-attn on the training machines for attention: auto"
    attention, why = attention_for(mem.attention, cls, flash_problem)
    if mem.attention == "flash" and attention == "flash":
        notes.append("attention: flash-attention 2 (no mask, no scores kept) "
                     + ("is installed here and runs on this GPU." if env.here else
                        "is assumed installed on the training machines (pip install 'tuner[flash]'); without it the run "
                        f"falls back to {'sdpa' if cls is None or cls.sdpa else 'eager'} and needs more memory."))
    elif mem.attention in ("flash", "auto") and attention != "flash" and recipe.uses_gpu:
        notes.append(f"attention: planned as {attention}: {why.split('; ')[0]}"
                     + ("; where flash-attn runs, the run uses it and needs less." if mem.attention == "auto" else "."))
    liger = mem.liger and recipe.uses_gpu and env.liger
    if mem.liger and recipe.uses_gpu and not env.liger:
        notes.append("memory.liger: liger-kernel is not installed on this machine, so the run trains without its "
                     "kernels, and the plan counts it so.")
    fold = None
    if recipe.objective.preference:
        fold = TRITON_FOLD if recipe.uses_gpu and env.triton else TORCH_FOLD
        if fold == TRITON_FOLD:
            notes.append("dpo/kto: TRL's fused log-prob head is planned with its Triton fold (no fp32 tiles), "
                         + ("triton being installed here." if env.here else
                            "assuming triton on the training machines (PyPI's CUDA torch ships it on Linux)."))
        elif recipe.uses_gpu:
            notes.append("dpo/kto: triton is not installed on this machine, so TRL's fused log-prob head folds each "
                         "tile with torch ops, and the plan counts its fp32 tiles.")
    return Kernels(attention=attention, liger=liger, logprob_fold=fold, notes=tuple(notes))
