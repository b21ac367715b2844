"""The wizard's one door to the memory planner, so a change of its interface is fixed here only.

Plans and advice are the planner's own :class:`~tuner.planner.MemoryPlan` and :class:`~tuner.planner.Advice`;
tests pass frozen functions in their place.
"""
from __future__ import annotations

from typing import Callable

from tuner.doctor import Check, check_disk
from tuner.planner import Advice, MemoryPlan
from tuner.planner import advise as planner_advise
from tuner.planner import plan as planner_plan
from tuner.recipe.io import RecipeError
from tuner.recipe.schema import Recipe


class CannotPlan(Exception):
    """The planner cannot plan this recipe; ``str()`` says why (shown where the plan would be)."""


class Planner:
    """Plans, advice and the disk check for a recipe (``disk`` reads the file system: call it off the UI thread)."""

    def __init__(self, plan: Callable[[Recipe], MemoryPlan] = planner_plan,
                 advise: Callable[[Recipe], list[Advice]] = planner_advise,
                 disk: Callable[[Recipe, MemoryPlan], Check] = check_disk):
        self._plan, self._advise, self.disk = plan, advise, disk

    def plan(self, recipe: Recipe) -> MemoryPlan:
        """The plan; raises CannotPlan with the planner's message."""
        try:
            return self._plan(recipe)
        except (RecipeError, ValueError) as exc:  # e.g. UnknownModelError: no architecture facts for model.id
            raise CannotPlan(str(exc)) from None

    def advise(self, recipe: Recipe) -> list[Advice]:
        try:
            return self._advise(recipe)
        except (RecipeError, ValueError) as exc:
            raise CannotPlan(str(exc)) from None


def worth_showing(advice: list[Advice], share: float = 0.02) -> list[Advice]:
    """The advisor's proposals without those another fitting one beats: as fast or faster, and no more than
    ``share`` of the GPU larger (the demo fits as is on eight A100s; costlier ways to save a few MiB add nothing)."""
    def beaten(candidate: Advice) -> bool:
        gpu = candidate.plan.gpu
        tolerance = share * (gpu.capacity_gib or gpu.total_gib)
        def beats(other: Advice) -> bool:
            if other.cost == candidate.cost:  # as fast: the smaller one
                return other.plan.gpu.total_gib < gpu.total_gib
            return other.cost < candidate.cost and other.plan.gpu.total_gib <= gpu.total_gib + tolerance

        return any(other is not candidate and other.fits and beats(other) for other in advice)

    return [item for item in advice if not (item.fits and beaten(item))]
