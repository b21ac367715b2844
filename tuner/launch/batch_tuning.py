"""``tuner probe --tune-batch``: pick the micro-batch by measurement, keeping the effective batch.

Trainer's ``auto_find_batch_size`` halves the batch after an out-of-memory error, in one process, and not under
ZeRO-3; here the candidates are the micro-batch sizes that divide the effective per-rank batch (micro-batch x
accumulation, so accumulation keeps the effective batch exactly) and that the plan predicts under the device less
the safety margin.  Largest first, each is probed — the recipe's whole world, a few steps on worst-case batches —
and kept when its measured peak stays under the margin; the fastest kept one (measured tokens/s) is chosen.  The
search stops once a smaller micro-batch measures slower than the best so far (throughput rises with the batch
until the device is saturated), after ``max_probes`` launches, or at a failure that is not memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tuner.launch.probe import PROBE_STEPS, ProbeResult, keep_results, launch_probe, probe_report
from tuner.launch.probe_report import speed_of
from tuner.planner.items import TIGHT_HEADROOM
from tuner.recipe.io import validate_recipe
from tuner.recipe.schema import Recipe
from tuner.recipe.source import RecipeError

DEFAULT_MARGIN = TIGHT_HEADROOM
MAX_PROBES = 4
MARGIN_REASON = ("a probe sees a few steps: over a long run the caching allocator's segments fragment and grow, and "
                 "other processes (a data loader, the system) take memory too; the planner calls a plan with less "
                 "than this share of the device free 'tight' for the same reason")


@dataclass
class Candidate:
    micro_batch_size: int
    accumulation: int
    recipe: Recipe
    memory_plan: object  # the plan of this micro-batch
    planned_gib: float
    result: ProbeResult | None = None
    measured_gib: float | None = None
    capacity_gib: float | None = None
    tokens_per_s: float | None = None
    verdict: str = "not probed"

    @property
    def overrides(self) -> list[str]:
        return [f"training.micro_batch_size={self.micro_batch_size}",
                f"training.gradient_accumulation_steps={self.accumulation}"]


@dataclass
class BatchTuning:
    recipe: Recipe
    margin: float
    candidates: list[Candidate]
    chosen: Candidate | None = None
    stopped: ProbeResult | None = None  # a probe stopped by a signal ends the search
    notes: list[str] = field(default_factory=list)

    def report(self) -> dict:
        """probe.json of a tuning: the search, and the report of every probe it launched."""
        return {
            "tuning": {"margin": self.margin, "margin_reason": MARGIN_REASON,
                       "effective_batch_per_rank": effective_per_rank(self.recipe),
                       "chosen": self.chosen.overrides if self.chosen else None,
                       "candidates": [{"micro_batch_size": c.micro_batch_size,
                                       "gradient_accumulation_steps": c.accumulation,
                                       "planned_gib": round(c.planned_gib, 4), "measured_gib": c.measured_gib,
                                       "capacity_gib": c.capacity_gib, "tokens_per_s": c.tokens_per_s,
                                       "verdict": c.verdict} for c in self.candidates]},
            "probes": [probe_report(c.result, c.memory_plan) for c in self.candidates if c.result is not None],
        }


def effective_per_rank(recipe: Recipe) -> int:
    return recipe.training.micro_batch_size * recipe.training.gradient_accumulation_steps


def _within(memory_plan, margin: float) -> bool:
    """The plan predicts every device it can check under its capacity less the margin (unknown capacity: yes)."""
    return all(device.total_gib <= device.capacity_gib * (1 - margin)
               for device in memory_plan.devices if device.capacity_gib)


def batch_candidates(recipe: Recipe, margin: float) -> list[Candidate]:
    """Every micro-batch size dividing the effective per-rank batch, largest first, with its plan; those the plan
    puts over the margin are marked so and never launched."""
    from tuner.planner import plan

    effective = effective_per_rank(recipe)
    candidates = []
    for micro in sorted((m for m in range(1, effective + 1) if effective % m == 0), reverse=True):
        data = recipe.model_dump(mode="json")
        data["training"].update(micro_batch_size=micro, gradient_accumulation_steps=effective // micro)
        try:
            candidate_recipe = validate_recipe(data)
        except RecipeError:
            continue  # a rule of the recipe refuses this size (e.g. a stream's batches)
        memory_plan = plan(candidate_recipe)
        candidate = Candidate(micro, effective // micro, candidate_recipe, memory_plan, memory_plan.gpu.total_gib)
        if not _within(memory_plan, margin):
            candidate.verdict = "plan: over the margin"
        candidates.append(candidate)
    return candidates


def tune_batch(recipe: Recipe, *, margin: float = DEFAULT_MARGIN, steps: int = PROBE_STEPS,
               max_probes: int = MAX_PROBES, force: bool = False,
               on_probe: Callable[[Candidate], None] | None = None, **probe_options) -> BatchTuning:
    """Probe the feasible micro-batch sizes (see the module's docstring) and choose the fastest under the margin;
    ``on_probe(candidate)`` is told before each launch, ``probe_options`` go to :func:`launch_probe`."""
    tuning = BatchTuning(recipe, margin, batch_candidates(recipe, margin))
    launched = 0
    for candidate in tuning.candidates:
        if candidate.verdict != "not probed":
            continue
        if launched == max_probes:
            candidate.verdict = f"not probed (--max-probes {max_probes})"
            continue
        if on_probe is not None:
            on_probe(candidate)
        result = launch_probe(candidate.recipe, steps=steps, force=force, **probe_options)
        launched += 1
        candidate.result = result
        keep_results(result, candidate.memory_plan)
        if result.status == "stopped":
            candidate.verdict, tuning.stopped = "stopped", result
            break
        if result.status == "failed":
            if (result.failure or {}).get("kind") == "out_of_memory":
                candidate.verdict = "out of memory"
                continue
            candidate.verdict = "failed"
            tuning.notes.append(f"micro-batch {candidate.micro_batch_size}: " + "; ".join(result.lines[:1]))
            break  # not a matter of memory: a smaller batch would fail the same way
        _judge(candidate, result, margin)
        if candidate.verdict != "kept":
            continue
        if tuning.chosen is None or candidate.tokens_per_s > tuning.chosen.tokens_per_s:
            tuning.chosen = candidate
        else:
            candidate.verdict = "kept, slower"
            break  # past the fastest: smaller micro-batches run slower still
    if tuning.chosen is not None:
        tuning.chosen.verdict = "chosen"
        for candidate in tuning.candidates:
            if candidate.verdict == "not probed":
                candidate.verdict = "not probed (a larger one measured slower)"
    return tuning


def _judge(candidate: Candidate, result: ProbeResult, margin: float) -> None:
    peak = result.peak(candidate.memory_plan)
    speed = speed_of(result.measured)
    candidate.measured_gib = peak.measured_gib if peak else None
    candidate.capacity_gib = peak.capacity_gib if peak else None
    candidate.tokens_per_s = speed["tokens_per_s"] if speed else None
    if peak is None or speed is None:
        candidate.verdict = "not measured"
    elif peak.capacity_gib and peak.measured_gib > peak.capacity_gib * (1 - margin):
        candidate.verdict = "over the margin"
    else:
        candidate.verdict = "kept"
