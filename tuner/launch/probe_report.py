"""A probe's measurements beside the plan: per rank and phase, per term group, with the error of the plan.

Pure: the ranks' ``probe`` events and the plan in, rows and lines out (the command prints them, probe.json keeps
them).  A GPU phase is compared at torch's three levels (allocated, reserved, device as nvidia-smi shows it); a
CPU phase by its peak resident set, the plan of a CPU recipe being every process together, so a rank's share is
the plan over the world size.  Term groups are what a measurement can tell apart:

- process (CPU: the resident set before the model loads, Python/torch/data) or outside the allocator (GPU: CUDA
  context, NCCL, sampled with cudaMemGetInfo),
- model states: what is held between steps (weights, adapters, gradients kept, optimizer states),
- step transients: the training step's peak above the model states (activations, logits and loss, gradients,
  the optimizer's temporaries),
- allocator cache (GPU): the caching allocator's reserved memory above its live tensors.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from tuner.planner.items import (ALWAYS, CATEGORIES, EVAL, GIB, LOAD, SAVE, STEP_MOMENTS, TRAINING_STEP, DevicePlan,
                                 MemoryPlan)
from tuner.rundir.events import Event, Probe

MEASURED_PHASES = (LOAD, TRAINING_STEP, EVAL, SAVE)  # in the order a probe runs them
GPU_LEVELS = {"allocated": "peak_allocated_gib", "reserved": "peak_reserved_gib", "device": "device_gib"}
PLAN_LEVELS = {"allocated": ("allocated",), "reserved": ("allocated", "reserved"),
               "device": ("allocated", "reserved", "device"), "RSS": ("allocated", "reserved", "device")}


@dataclass(frozen=True)
class Row:
    """One comparison: ``what`` (a phase or a term group) on one rank, at one level."""

    what: str
    rank: int
    level: str  # allocated / reserved / device on a GPU, RSS on the CPU
    measured_gib: float | None
    planned_gib: float | None

    @property
    def error(self) -> float | None:
        """(measured - plan) / plan: positive when the plan was too low."""
        if self.measured_gib is None or not self.planned_gib:
            return None
        return (self.measured_gib - self.planned_gib) / self.planned_gib

    def to_dict(self) -> dict:
        error = self.error
        return {**asdict(self), "error": None if error is None else round(error, 4)}


def by_rank_and_phase(events: list[Event]) -> dict[int, dict[str, dict]]:
    """rank -> phase -> that rank's ``probe`` event for the phase, as written (probe.json keeps it)."""
    measured: dict[int, dict[str, dict]] = {}
    for event in events:
        if isinstance(event, Probe):
            measured.setdefault(int(event.rank), {})[event.phase] = event.to_json()
    return dict(sorted(measured.items()))


def _share(device: DevicePlan, world: int) -> float:
    """What one rank holds of the device's plan: a GPU is one rank's, a CPU recipe's device holds every process."""
    return 1.0 if device.kind == "gpu" else 1.0 / max(world, 1)


def phase_rows(measured: dict[int, dict[str, dict]], memory_plan: MemoryPlan, world: int) -> list[Row]:
    device = memory_plan.gpu
    share = _share(device, world)
    rows = []
    for rank, phases in measured.items():
        for phase in MEASURED_PHASES:
            event = phases.get(phase)
            if event is None:
                continue
            planned = phase in device.phases
            levels = GPU_LEVELS if "peak_allocated_gib" in event else {"RSS": "peak_rss_gib"}
            for level, key in levels.items():
                plan_gib = device.phase_gib(phase, PLAN_LEVELS[level]) * share if planned else None
                rows.append(Row(phase, rank, level, event.get(key), plan_gib))
    return rows


def _categories(items) -> str:
    present = [c for c in CATEGORIES if any(i.category == c and i.bytes > 0 for i in items)]
    return ", ".join(c.replace("_", " ") for c in present)


def group_rows(measured: dict[int, dict[str, dict]], memory_plan: MemoryPlan, world: int) -> list[Row]:
    """Each rank's term groups at the training step (see the module's docstring), the plan's named by its terms."""
    device = memory_plan.gpu
    share = _share(device, world)
    always = [i for i in device.items if i.phase == ALWAYS]
    states_items = [i for i in always if i.level == "allocated"]
    outside_items = [i for i in always if i.level == "device"]
    states = sum(i.bytes for i in states_items) / GIB
    step_allocated = device.phase_gib(TRAINING_STEP, ("allocated",))
    step_reserved = device.phase_gib(TRAINING_STEP, ("allocated", "reserved"))
    transient_items = [i for i in device.items if i.level == "allocated" and i.phase != ALWAYS
                       and any(i.live_in(moment) for moment in STEP_MOMENTS)]
    rows = []
    for rank, phases in measured.items():
        step, loading = phases.get(TRAINING_STEP), phases.get(LOAD, {})
        if step is None:
            continue
        between = step.get("between_steps_gib")
        gpu = "peak_allocated_gib" in step
        if gpu:
            named = [(f"outside the allocator ({_categories(outside_items) or 'overhead'})",
                      step.get("outside_allocator_gib"), sum(i.bytes for i in outside_items) / GIB),
                     (f"model states ({_categories(states_items)})", between, states),
                     (f"step transients ({_categories(transient_items)})",
                      _difference(step.get("peak_allocated_gib"), between), step_allocated - states),
                     ("allocator cache (reserved above allocated)",
                      _difference(step.get("peak_reserved_gib"), step.get("peak_allocated_gib")),
                      step_reserved - step_allocated)]
            level = "GPU"
        else:
            baseline = loading.get("baseline_rss_gib")
            named = [(f"process ({_categories(outside_items) or 'overhead'}: Python, torch, data)", baseline,
                      sum(i.bytes for i in outside_items) / GIB * share),
                     (f"model states ({_categories(states_items)})", _difference(between, baseline), states * share),
                     (f"step transients ({_categories(transient_items)})",
                      _difference(step.get("peak_rss_gib"), between), (step_allocated - states) * share)]
            level = "RSS"
        rows += [Row(what, rank, level, measured_gib, round(planned_gib, 6))
                 for what, measured_gib, planned_gib in named]
    return rows


def _difference(high: float | None, low: float | None) -> float | None:
    return None if high is None or low is None else round(high - low, 4)


@dataclass(frozen=True)
class Peak:
    """The probe's peak on the training device, as the plan's total counts it: per GPU (the busiest rank), or on
    the CPU every process together (the ranks' peaks of each phase added up)."""

    measured_gib: float
    planned_gib: float
    phase: str
    rank: int | None  # the busiest GPU's rank; None on the CPU (every rank together)
    capacity_gib: float | None  # the device's memory as the ranks saw it
    what: str

    @property
    def error(self) -> float:
        return (self.measured_gib - self.planned_gib) / self.planned_gib if self.planned_gib else 0.0


def probe_peak(measured: dict[int, dict[str, dict]], memory_plan: MemoryPlan) -> Peak | None:
    events = [event for phases in measured.values() for event in phases.values()]
    if not events:
        return None
    planned = memory_plan.gpu.total_gib
    capacity = max((event.get("capacity_gib") or 0.0) for event in events) or None
    if "device_gib" in events[0]:
        busiest = max(events, key=lambda event: event["device_gib"])
        return Peak(busiest["device_gib"], planned, busiest["phase"], int(busiest["rank"]), capacity,
                    "peak GPU memory of the busiest rank (reserved + outside the allocator)")
    totals = {phase: sum(phases[phase]["peak_rss_gib"] for phases in measured.values() if phase in phases)
              for phase in MEASURED_PHASES}
    phase = max(totals, key=totals.get)
    ranks = len(measured)
    return Peak(round(totals[phase], 4), planned, phase, None, capacity,
                f"peak resident set of {'the process' if ranks == 1 else f'all {ranks} processes together'}")


def _gib(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:+.0%}"


def table_lines(title: str, rows: list[Row]) -> list[str]:
    width = max([len(title), *(len(row.what) for row in rows)])
    lines = [f"{title:<{width}}  rank  level      measured GiB  plan GiB  error"]
    for row in rows:
        lines.append(f"{row.what:<{width}}  {row.rank:>4}  {row.level:<9}  {_gib(row.measured_gib):>12}  "
                     f"{_gib(row.planned_gib):>8}  {_percent(row.error):>5}")
    return lines


def speed_of(measured: dict[int, dict[str, dict]]) -> dict | None:
    """Tokens/s of the timed steps, as rank 0 counted them (every rank's tokens)."""
    first = next(iter(measured.values()), {}).get(TRAINING_STEP)
    if first is None or "tokens_per_s" not in first:
        return None
    return {key: first[key] for key in ("tokens_per_s", "seconds_per_step", "timed_steps") if key in first}
