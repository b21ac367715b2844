"""Environment checks before a run burns GPU hours: one function per check, each returning a :class:`Check`.

A check is ``fail`` only when the given recipe needs what is missing (or when tuner cannot work at all);
without a recipe, missing optional pieces are ``warn``.  Heavy libraries are imported inside the checks,
and a check that crashes is reported as a failed check, never as a traceback.

The checks live by what they look at (``gpu``, ``libraries``, ``machine``); this module is the report: their
order, and a check that crashes turned into a failed line.
"""
from __future__ import annotations

from typing import Callable

from tuner.check import Check
from tuner.doctor.gpu import check_bf16, check_gpus, check_nccl, check_torch
from tuner.doctor.libraries import (check_bitsandbytes, check_deepspeed, check_flash_attn, check_kernels, check_liger,
                                    check_trackers, check_vllm)
from tuner.doctor.machine import check_accelerate_config, check_disk, check_host_ram, check_model, check_shared_memory
from tuner.recipe.schema import Recipe
from tuner.reason import library_words


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
