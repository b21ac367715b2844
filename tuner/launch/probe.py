"""``tuner probe``: measure the recipe on this machine before the long run, and pick the micro-batch by measurement.

A probe is a run of the recipe's own world — every rank, the same rendered files and ``accelerate launch`` as
``tuner run``, prepared and followed through the one run contract (:func:`~tuner.launch.run.prepare_run`,
:func:`~tuner.launch.run.follow_run`) — in ``<run dir>/probe/``, for a few optimizer steps on worst-case batches
(``max_seq_length`` tokens per sample), one evaluation of the largest evaluation batch and one checkpoint save.
The ranks measure each phase (:mod:`tuner.train.probe`); this module compares them with the plan, writes
``probe.json`` and keeps a record under ``$TUNER_HOME`` that a later ``tuner plan`` shows beside its prediction.

No hangs: when a rank reports an error, the others get :data:`ERROR_GRACE_S` to stop on their own (torchrun stops
them when one exits), then every rank is stopped; the probe names the rank, the phase and the batch.  The probe's
checkpoint is removed once measured: it holds a model trained a few steps on made-up batches.
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner.fileio import atomic_write_text
from tuner.launch.probe_report import (
    Peak,
    by_rank_and_phase,
    group_rows,
    phase_rows,
    probe_peak,
    speed_of,
    table_lines,
)
from tuner.launch.run import follow_run, prepare_run
from tuner.launch.runner import log_tail
from tuner.planner.items import TRAINING_STEP
from tuner.recipe.io import validate_recipe
from tuner.recipe.schema import Recipe
from tuner.recipe.source import RecipeError
from tuner.rundir.events import Error, Event, ProbePhase
from tuner.rundir.layout import CHECKPOINTS_DIR, LOG_FILE, PROBE_DIR, PROBE_REPORT, PROBE_REQUEST
from tuner.rundir.lock import RunLock, RunLocked
from tuner.rundir.manifest import amend

PROBE_STEPS = 3  # the first creates the optimizer states and warms caches; the others are timed
ERROR_GRACE_S = 5.0  # after a rank's error, the time the others get to stop on their own before all are stopped
STOP_GRACE_S = 3.0  # then: SIGINT, this long, SIGTERM, SIGKILL (a probe has nothing to save)


def probe_recipe(recipe: Recipe, steps: int = PROBE_STEPS) -> Recipe:
    """The recipe as a probe runs it: its own tactics, world and data, in ``<output.dir>/probe``, for ``steps``
    optimizer steps with an evaluation (when the recipe evaluates) and a checkpoint at the last one; no warm-up, no
    resume, no trackers."""
    data = recipe.model_dump(mode="json")
    data["output"]["dir"] = str(Path(recipe.output.dir) / PROBE_DIR)
    data["training"].update(max_steps=steps, save_steps=steps, logging_steps=1, warmup_steps=0, resume="never",
                            report_to=[], eval_steps=steps if recipe.data.eval_fraction > 0 else None)
    return validate_recipe(data)


@dataclass
class ProbeResult:
    recipe: Recipe  # the recipe probed (not the probe's own copy)
    run_dir: Path  # the probe's run directory
    status: str  # measured, failed, stopped
    exit_code: int
    events: list[Event]
    failure: dict | None = None  # rank, phase, batch, message of the first rank that failed
    lines: list[str] = field(default_factory=list)  # what to tell the user
    stopped_after_s: float | None = None  # from the first rank's error to every rank gone

    @property
    def measured(self) -> dict[int, dict[str, dict]]:
        return by_rank_and_phase(self.events)

    def peak(self, memory_plan) -> Peak | None:
        return probe_peak(self.measured, memory_plan)


def _failure(events: list[Event], log_path: Path, outcome_lines: list[str]) -> dict | None:
    """The first rank that failed: from its error event, else from torchrun's summary; with its phase and batch."""
    from tuner.launch.failures import rank_failures

    error = next((event for event in events if isinstance(event, Error)), None)
    if error is not None:
        rank, message, kind = int(error.rank or 0), str(error.message or ""), error.error_kind
    else:
        failures = rank_failures(log_tail(log_path)) if log_path.exists() else []
        if not failures and not outcome_lines:
            return None
        rank = failures[0].rank if failures else 0
        message = failures[0].how() if failures else (outcome_lines[0] if outcome_lines else "failed")
        kind = None
    if kind is None and any(text in message for text in ("out of memory", "can't allocate memory", "MemoryError")):
        kind = "out_of_memory"
    started = [event for event in events if isinstance(event, ProbePhase) and event.rank == rank]
    last = started[-1] if started else ProbePhase(phase="start-up")
    return {"rank": rank, "phase": last.phase or "start-up", "batch": last.batch, "message": message,
            "kind": kind, "time": error.time if error else None}


def failure_line(failure: dict) -> str:
    """``rank 1 ran out of memory during the training step on a batch of 64 x 256 tokens``, with the rank's own
    words when it failed otherwise (a rank's out-of-memory advice names the probe's copy of the recipe: not shown)."""
    batch = failure.get("batch") or {}
    on = f" on a batch of {batch['text']}" if batch.get("text") else ""
    if failure.get("kind") == "out_of_memory":
        return f"rank {failure['rank']} ran out of memory during {_the(failure['phase'])}{on}"
    message = failure["message"].splitlines()[0] if failure["message"] else "no message"
    return f"rank {failure['rank']} failed during {_the(failure['phase'])}{on}: {message}"


def _the(phase: str) -> str:
    return f"the {phase}" if phase == TRAINING_STEP else phase


def launch_probe(recipe: Recipe, *, steps: int = PROBE_STEPS, force: bool = False,
                 on_update: Callable[[list[Event], list[str]], None] | None = None,
                 stop: threading.Event | None = None, say: Callable[[str], None] | None = None,
                 notes: Callable[[list[str]], None] | None = None, progress: bool = True) -> ProbeResult:
    """Probe ``recipe``: prepare and follow its probe run, stop every rank soon after one fails, remove the probe's
    checkpoint.  ``force`` launches a plan that does not fit (what ``--force`` is to ``tuner run``); ``notes`` gets
    what prepare_run says before the launch; ``say`` and ``progress`` are the run contract's (stderr, and a
    download's progress bar, by default)."""
    if recipe.hardware.machines > 1:
        raise RecipeError(["hardware.machines: tuner probe launches the world of one machine; a recipe of "
                           f"{recipe.hardware.machines} machines is not probed yet (probe a one-machine copy of it "
                           "with --set hardware.machines=1 to measure one machine's ranks)."])
    parent = RunLock(recipe.output.dir)  # the run the probe is for: no tuner runs it meanwhile
    try:
        parent.acquire()
    except RunLocked as exc:
        raise RecipeError([str(exc)]) from None
    try:
        said = {"say": say} if say is not None else {}
        prepared = prepare_run(probe_recipe(recipe, steps), force=force, progress=progress, **said)
        if notes is not None:
            notes(prepared.notes)
        atomic_write_text(prepared.run_dir / PROBE_REQUEST, json.dumps({"steps": steps}) + "\n")
        amend(prepared.run_dir, written=[PROBE_REQUEST])
        return _follow(recipe, prepared, on_update, stop, said)
    finally:
        parent.release()


def _follow(recipe, prepared, on_update, stop, said: dict) -> ProbeResult:
    stop = stop or threading.Event()
    events: list[Event] = []
    first_error: list[float] = []
    watchdog: list[threading.Timer] = []

    def collect(new_events: list[Event], lines: list[str]) -> None:
        events.extend(new_events)
        if not first_error and any(isinstance(event, Error) for event in new_events):
            first_error.append(time.monotonic())
            timer = threading.Timer(ERROR_GRACE_S, stop.set)  # the other ranks may be blocked in a collective
            timer.daemon = True
            timer.start()
            watchdog.append(timer)
        if on_update is not None:
            on_update(new_events, lines)

    try:
        outcome = follow_run(prepared, on_update=collect, stop=stop, stop_grace_s=STOP_GRACE_S, **said)
    finally:
        for timer in watchdog:
            timer.cancel()
    ended = time.monotonic()
    run_dir = prepared.run_dir
    shutil.rmtree(run_dir / CHECKPOINTS_DIR, ignore_errors=True)  # a few steps on made-up batches: nothing to keep
    failure = None
    status = "measured" if outcome.status == "finished" else outcome.status
    if first_error or outcome.status == "failed":
        status = "failed"
        failure = _failure(events, run_dir / LOG_FILE, outcome.lines)
    result = ProbeResult(recipe, run_dir, status, outcome.exit_code or (1 if status == "failed" else 0), events,
                         failure, stopped_after_s=round(ended - first_error[0], 1) if first_error else None)
    if failure is not None:
        result.lines = [failure_line(failure)]
        if result.stopped_after_s is not None:
            result.lines.append(f"every rank stopped {result.stopped_after_s:.1f} s after rank {failure['rank']}'s "
                                "error")
        else:  # no rank said why (killed, e.g. by the kernel's out-of-memory killer): the launcher's account
            result.lines += outcome.lines
    elif status == "stopped":
        result.lines = [outcome.lines[0].split(";")[0] + "; the probe measured nothing complete."]
    return result


def report_lines(result: ProbeResult, memory_plan) -> list[str]:
    """Measured beside planned, per rank and phase and per term group, then the speed and the peak."""
    world = result.recipe.world_size
    measured = result.measured
    lines = table_lines("phase", phase_rows(measured, memory_plan, world)) + [""]
    lines += table_lines("term group (training step)", group_rows(measured, memory_plan, world))
    speed = speed_of(measured)
    if speed:
        lines.append(f"speed: {speed['tokens_per_s']:,.0f} tokens/s ({speed['seconds_per_step']:.3f} s per optimizer "
                     f"step over {speed['timed_steps']} timed step(s) after the first)")
    peak = result.peak(memory_plan)
    if peak is not None:
        where = f"rank {peak.rank}, " if peak.rank is not None else ""
        lines.append(f"peak: {peak.measured_gib:.3f} GiB measured ({where}{peak.phase}) vs {peak.planned_gib:.3f} GiB "
                     f"planned ({peak.error:+.0%}); {peak.what}")
    if any(not event.get("resets_peak", True) for phases in measured.values() for event in phases.values()):
        lines.append("note: this system cannot reset the peak resident set between phases; each phase's peak "
                     "includes the phases before it.")
    return lines


def probe_report(result: ProbeResult, memory_plan) -> dict:
    """probe.json: every rank's measurements per phase, the comparison with the plan, versions and devices."""
    from tuner.planner.measured import library_versions, machine_devices

    measured = result.measured
    world = result.recipe.world_size
    peak = result.peak(memory_plan)
    devices = {str(rank): next(iter(phases.values())).get("device") for rank, phases in measured.items()}
    return {
        "recipe": result.recipe.name, "run_dir": str(result.run_dir), "status": result.status,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "world_size": world,
        "batch": {"micro_batch_size": result.recipe.training.micro_batch_size,
                  "gradient_accumulation_steps": result.recipe.training.gradient_accumulation_steps,
                  "tokens_per_sample": result.recipe.training.max_seq_length, "packed": result.recipe.data.packing},
        "versions": library_versions(), "machine": machine_devices(result.recipe), "devices": devices,
        "ranks": {str(rank): phases for rank, phases in measured.items()},
        "phases": [row.to_dict() for row in phase_rows(measured, memory_plan, world)],
        "term_groups": [row.to_dict() for row in group_rows(measured, memory_plan, world)],
        "speed": speed_of(measured),
        "peak": None if peak is None else {**peak.__dict__, "error": round(peak.error, 4)},
        "failure": result.failure, "stopped_after_s": result.stopped_after_s,
        "plan": memory_plan.gpu.to_dict(),
    }


def keep_results(result: ProbeResult, memory_plan) -> Path:
    """Write probe.json into the probe's run directory and, for a complete probe, the record ``tuner plan`` shows."""
    from tuner.planner.measured import MeasuredRecord, save_record

    report = probe_report(result, memory_plan)
    path = atomic_write_text(result.run_dir / PROBE_REPORT, json.dumps(report, indent=2, default=str) + "\n")
    amend(result.run_dir, written=[PROBE_REPORT])
    peak = result.peak(memory_plan)
    if result.status == "measured" and peak is not None:
        save_record(result.recipe, MeasuredRecord(time.strftime("%Y-%m-%d"), peak.measured_gib, peak.planned_gib,
                                                  peak.what, str(path.resolve())))
    return path
