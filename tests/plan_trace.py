"""A recipe's plan held to the fake-tensor trace of its real step: the verdict judged, and the allocated
training-step peak within the issue's 8% of MemTracker's."""
from __future__ import annotations

import pytest

from tuner.loading.simulate import simulate
from tuner.planner import plan
from tuner.planner.items import TRAINING_STEP

TOLERANCE = 0.08  # the bound; every cell's error is in docs/memory.md


def assert_plan_matches_trace(recipe):
    """The plan of ``recipe`` judges it "fits" and its training-step peak is the trace's within TOLERANCE."""
    memory_plan = plan(recipe)
    assert not memory_plan.unmodelled and memory_plan.verdict == "fits"
    simulated = simulate(recipe)
    assert simulated.error is None
    predicted = memory_plan.devices[0].phase_gib(TRAINING_STEP, ("allocated",))
    assert predicted == pytest.approx(simulated.peak_gib, rel=TOLERANCE), simulated.peak_by_category
    return memory_plan
