"""The wizard's one door to the memory planner, so a change of its interface is fixed here only.

Plans and advice are the planner's own :class:`~tuner.planner.MemoryPlan` and :class:`~tuner.planner.Advice`;
tests pass frozen functions in their place.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # imported when first used: the first screen paints before the schema and the planner load
    from tuner.check import Check
    from tuner.planner import Advice, MemoryPlan
    from tuner.planner.measured import MeasuredRecord
    from tuner.recipe.schema import Recipe


class CannotPlan(Exception):
    """The planner cannot plan this recipe; ``str()`` says why (shown where the plan would be)."""


class Planner:
    """Plans, advice and the disk check for a recipe (``disk`` reads the file system: call it off the UI thread).

    The planner's own functions by default, imported at the first use (after the first screen is painted).
    """

    def __init__(self, plan: Callable[[Recipe], MemoryPlan] | None = None,
                 advise: Callable[..., list[Advice]] | None = None,
                 disk: Callable[[Recipe, MemoryPlan], Check] | None = None,
                 measured: Callable[[Recipe], MeasuredRecord | None] | None = None):
        self._plan, self._advise, self._disk, self._measured = plan, advise, disk, measured

    def _defaults(self) -> None:
        from tuner.free_space import disk_room
        from tuner.planner import advise, plan
        from tuner.planner.measured import measured_record

        self._plan, self._advise, self._disk = self._plan or plan, self._advise or advise, self._disk or disk_room
        self._measured = self._measured or measured_record

    def plan(self, recipe: Recipe) -> MemoryPlan:
        """The plan; raises CannotPlan with the planner's message."""
        from tuner.catalog.model_config import UnknownModelError
        from tuner.recipe.source import RecipeError

        if self._plan is None:
            self._defaults()
        try:
            return self._plan(recipe)
        except UnknownModelError as exc:  # no architecture facts for the model a field names, said as the CLI says it
            raise CannotPlan(f"{exc.field}: {exc}") from None
        except (RecipeError, ValueError) as exc:
            raise CannotPlan(str(exc)) from None

    def advise(self, recipe: Recipe, host_ram_gib: float | None = None) -> list[Advice]:
        """The advisor's plans; ``host_ram_gib``: the machines' RAM where the recipe gives none (this machine's)."""
        from tuner.recipe.source import RecipeError

        if self._advise is None:
            self._defaults()
        try:
            return self._advise(recipe, host_ram_gib=host_ram_gib)
        except (RecipeError, ValueError) as exc:
            raise CannotPlan(str(exc)) from None

    def measured(self, recipe: Recipe) -> MeasuredRecord | None:
        """What a probe of this setup measured on this machine (``tuner probe``), or None."""
        if self._measured is None:
            self._defaults()
        return self._measured(recipe)

    def disk(self, recipe: Recipe, plan: MemoryPlan) -> Check:
        if self._disk is None:
            self._defaults()
        return self._disk(recipe, plan)


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
