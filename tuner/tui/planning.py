"""The wizard's one door to the memory planner, so a change of its interface is fixed here only.

``plan`` and ``advise`` come from :mod:`tuner.planner`; while it cannot be imported the
wizard shows "planner unavailable" instead of guessing numbers of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tuner.recipe.io import RecipeError
from tuner.recipe.schema import Recipe


class CannotPlan(Exception):
    """The planner cannot plan this recipe; ``str()`` says why (shown where the plan would be)."""


@dataclass(frozen=True)
class Proposal:
    """One advisor alternative: the changed recipe, its plan and why it was proposed."""

    recipe: Recipe
    plan: Any
    reasons: list[str]
    summary: str  # one line: what changes and what it costs
    fits: bool


class Planner:
    """Plans and advice for a recipe; ``available`` is False when :mod:`tuner.planner` is missing."""

    def __init__(self, plan: Callable[[Recipe], Any] | None = None, advise: Callable[[Recipe], list] | None = None):
        if plan is None:
            plan, advise = _import_planner()
        self._plan, self._advise = plan, advise

    @property
    def available(self) -> bool:
        return self._plan is not None

    def plan(self, recipe: Recipe) -> Any | None:
        """The plan, or None without a planner; raises CannotPlan with the planner's message."""
        if self._plan is None:
            return None
        try:
            return self._plan(recipe)
        except (RecipeError, ValueError) as exc:  # e.g. UnknownModelError: no architecture facts for model.id
            raise CannotPlan(str(exc)) from None

    def advise(self, recipe: Recipe) -> list[Proposal]:
        if self._advise is None:
            return []
        return [_proposal(item) for item in self._advise(recipe)]


def _import_planner():
    try:
        from tuner.planner import advise, plan
    except ImportError:
        return None, None
    return plan, advise


def _proposal(advice: Any) -> Proposal:
    """From a :class:`tuner.planner.Advice`."""
    return Proposal(recipe=advice.recipe, plan=advice.plan, reasons=list(advice.reasons),
                    summary=advice.summary(), fits=bool(advice.fits))
