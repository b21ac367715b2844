"""Topology advice: the fewest GPUs of the recipe's type on which it fits without offloading anything.

Where the ladder (:mod:`tuner.planner.advisor`) ends in offload -- CPU RAM bandwidth paid every step -- more GPUs
of the same kind often fit with cheaper tactics.  This walks layouts with more GPUs, fewest first (one machine up to
8, then more machines of the recipe's size), and asks the advisor's own search for the cheapest plan on each.
"""
from __future__ import annotations

import math

from tuner.planner.advisor import Advice, change_label, override_lines, reason, search_plans, validated
from tuner.recipe.tactics import Rung, Tactics, rungs_between, tactics_of

MOST_MACHINES = 64  # how far the topology advice looks
OFFLOADS = (Rung.ACTIVATION_OFFLOADING, Rung.OFFLOAD_OPTIMIZER, Rung.OFFLOAD_PARAMS)
PLACEHOLDER_ADDRESS = "10.0.0.1"  # machine rank 0's address in the advice, for the user to replace


def uses_offload(recipe) -> bool:
    """Whether a recipe moves states or activations to CPU RAM (what the topology advice avoids)."""
    mem = recipe.memory
    return mem.activation_offloading or mem.offload_optimizer != "none" or mem.offload_params != "none"


def topology(recipe) -> Advice | None:
    """The fewest GPUs of the recipe's type on which it fits without offloading anything, at the cheapest tactics
    there (same method; more machines of the recipe's size, or more GPUs in its one machine up to 8); None on a CPU
    or where even MOST_MACHINES machines would not do.  The effective batch is kept where accumulation allows."""
    if not recipe.uses_gpu:
        return None
    base = tactics_of(recipe)

    def without_offload(frugal: bool):
        def keep(start: Tactics, tactics: Tactics) -> bool:
            if tactics.method != start.method or set(OFFLOADS) & set(rungs_between(start, tactics)):
                return False
            return not frugal or (tactics.checkpointing and tactics.micro_batch == 1)
        return keep

    layouts = _layouts(recipe)
    largest = _on_layout(recipe, *layouts[-1], base)
    if largest is None or not search_plans(largest, without_offload(frugal=True))[1]:
        return None  # not even the most GPUs tried would do
    for machines, gpus in layouts:
        candidate = _on_layout(recipe, machines, gpus, base)
        if candidate is None or not search_plans(candidate, without_offload(frugal=True))[1]:
            continue  # not even the most frugal tactics fit here: no need to price the rest
        _, cost, _, _, found, memory_plan, changes = search_plans(candidate, without_offload(frugal=False))[1][0]
        finished = found if found is candidate else validated(found)
        where = f"{machines} machines x {gpus}" if machines > 1 else "one machine"
        label = change_label(candidate, finished)  # beside the layout, which the head names
        head = (f"on {machines * gpus} GPUs ({where} {_gpu_name(recipe)}) {label or 'the recipe as is'} "
                f"fits at {memory_plan.gpu.total_gib:.0f} GiB, no offload")
        reasons = [head] + [reason(finished, c) for c in dict.fromkeys(changes)]
        if finished.effective_batch_size != recipe.effective_batch_size:
            reasons.append(f"the effective batch becomes {finished.effective_batch_size} (was "
                           f"{recipe.effective_batch_size}): every data-parallel rank takes at least one sample a step")
        if machines > 1 and recipe.hardware.main_process_ip is None:
            reasons.append("set hardware.main_process_ip to machine rank 0's address")
        return Advice(finished, memory_plan, cost, reasons, changes, overrides=override_lines(recipe, finished),
                      label=change_label(recipe, finished))
    return None


def _gpu_name(recipe) -> str:
    hw = recipe.hardware
    return hw.gpu or f"{hw.gpu_memory_gb:g}GB"


def _layouts(recipe) -> list[tuple[int, int]]:
    """(machines, GPUs per machine) with more GPUs than the recipe's, fewest first."""
    hw = recipe.hardware
    layouts = []
    gpus = hw.gpus_per_machine
    while hw.machines == 1 and gpus < 8:
        gpus *= 2
        layouts.append((1, gpus))
    return layouts + [(machines, max(gpus, hw.gpus_per_machine)) for machines in range(hw.machines + 1, MOST_MACHINES + 1)]


def _on_layout(recipe, machines: int, gpus: int, base: Tactics):
    """The recipe on ``machines`` x ``gpus`` GPUs, its effective batch kept where accumulation allows; None where
    the recipe cannot run so (its tp no longer divides the machine, say)."""
    from tuner.recipe.io import validate_recipe
    from tuner.recipe.source import RecipeError

    data = recipe.model_dump(mode="json")
    data["hardware"].update(machines=machines, gpus_per_machine=gpus, num_processes=None,
                            main_process_ip=recipe.hardware.main_process_ip or
                            (PLACEHOLDER_ADDRESS if machines > 1 else None))
    data["parallelism"].update(dp_replicate=None, dp_shard=None)
    data["memory"].update(offload_optimizer="none", offload_params="none", activation_offloading=False)
    data_parallel = machines * gpus // (base.tp * base.seq_shards)
    data["training"]["gradient_accumulation_steps"] = max(1, math.ceil(
        recipe.effective_batch_size / (base.micro_batch * data_parallel)))
    try:
        return validate_recipe(data)
    except RecipeError:
        return None
