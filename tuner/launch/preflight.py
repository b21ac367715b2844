"""The check before a launch: is this run predicted to fit in memory?

A run that would die of out-of-memory after minutes of loading is refused up front, naming the
missing memory and the advisor's cheapest fix; ``--force`` launches it anyway.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.planner import advise, plan
from tuner.recipe.schema import Recipe


@dataclass(frozen=True)
class MemoryCheck:
    refused: bool
    message: str | None  # why it is refused, or a note for a tight plan; None when it simply fits


def check_memory(recipe: Recipe) -> MemoryCheck:
    """The planner's verdict as a launch decision."""
    memory = plan(recipe)
    device = memory.gpu
    usage = f"{device.total_gib:.1f} GiB of {device.capacity_gib or 0:.1f} GiB"
    if memory.verdict == "tight":
        return MemoryCheck(False, f"note: the plan is tight on {device.name} ({usage}); an out-of-memory stop is possible.")
    if memory.verdict != "does not fit":
        return MemoryCheck(False, None)
    lines = [f"predicted not to fit: {memory.missing_gib:.1f} GiB missing on each {device.name} (needs {usage})."]
    advice = advise(recipe)
    if advice and advice[0].fits:
        lines.append(f"cheapest fix: {advice[0].summary()}")
        lines += [f"  - {reason}" for reason in advice[0].reasons]
        lines.append("every option: `tuner plan RECIPE --advise`.")
    elif advice:
        lines += [f"  - {reason}" for reason in advice[0].reasons]
    return MemoryCheck(True, "\n".join(lines))
