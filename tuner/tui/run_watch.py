"""What the Run screen shows of a launched run, folded from its events and log lines.

Pure Python (no textual): the app's worker feeds it, the screen reads it; a finished
run's events file replays into the same state.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.run_layout import LOCK_FILE

LOG_LINES = 400


@dataclass
class RunWatch:
    run_dir: Path
    live: bool = False  # launched from this wizard (a replayed run is not)
    plan: Any = None  # the memory plan the run was launched with, to compare measured memory against
    status: str = "starting"
    step: int = 0
    max_steps: int | None = None
    losses: list[float] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    eta_s: float | None = None
    memory_gib: dict[str, float] = field(default_factory=dict)  # peak over ranks, e.g. {"allocated": 12.1}
    memory_per_rank: dict[str, list[float]] = field(default_factory=dict)  # with several ranks
    final_dir: str | None = None
    error: str | None = None
    cancelled: bool = False
    outcome: list[str] = field(default_factory=list)  # how it ended, or why it did not start (tuner.launch.run)
    can_override: bool = False  # refused by a check the user may override ("Launch anyway")
    exit_code: int | None = None
    log: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    since: float = 0.0  # events older than the launch belong to an earlier run in the same directory

    @property
    def running(self) -> bool:
        return self.live and self.exit_code is None

    def absorb(self, events: list[dict], log_lines: list[str] = ()) -> None:
        self.log.extend(log_lines)
        for event in events:
            if event.get("time", self.since) < self.since:
                continue
            kind = event.get("event")
            if "step" in event:
                self.step = int(event["step"])
            if event.get("max_steps"):
                self.max_steps = int(event["max_steps"])
            if kind == "started":
                self.status = "running"
            elif kind == "step":
                self.status = "running"
                if "loss" in event:
                    self.losses.append(float(event["loss"]))
            elif kind == "eval" and "eval_loss" in event:
                self.eval_losses.append(float(event["eval_loss"]))
            elif kind == "finished":
                self.final_dir = event.get("final_dir")
            elif kind == "error":
                self.error = str(event.get("message"))
            if "tokens_per_s" in event:
                self.tokens_per_s = float(event["tokens_per_s"])
            if "eta_s" in event:
                self.eta_s = float(event["eta_s"])
            for key, value in event.items():
                if key.startswith("peak_") and key.endswith("_gib"):
                    self.memory_gib[key.removeprefix("peak_").removesuffix("_gib")] = float(value)
                elif key.startswith("peak_") and key.endswith("_gib_per_rank"):
                    self.memory_per_rank[key.removeprefix("peak_").removesuffix("_gib_per_rank")] = list(value)

    def refuse(self, lines: list[str], can_override: bool) -> None:
        """The run did not start: the checks refused it, or it must be started on every machine."""
        self.status = "not started"
        self.exit_code = 2
        self.outcome = list(lines)
        self.can_override = can_override

    def finish(self, exit_code: int, lines: list[str] = ()) -> None:
        self.exit_code = exit_code
        self.outcome = list(lines)
        if self.cancelled:
            self.status = "cancelled"
        elif exit_code == 0:
            self.status = "finished"
            if self.max_steps:
                self.step = self.max_steps
        else:
            self.status = f"failed (exit code {exit_code})"


def replay(run_dir: Path) -> RunWatch:
    """The state of a run from its events file (recent runs on the Start screen)."""
    from tuner.events import read_events
    from tuner.run_layout import EVENTS_FILE

    watch = RunWatch(run_dir=run_dir, status="not started")
    events = read_events(run_dir / EVENTS_FILE)
    watch.absorb(events)
    last = events[-1]["event"] if events else None
    if last == "finished":
        watch.status = "finished"
    elif last == "error" or watch.error:
        watch.status = "failed"
    elif events:
        watch.status = f"stopped at step {watch.step}"
    return watch


def recent_runs(root: Path, limit: int = 8) -> list[RunWatch]:
    """Run directories under ``root`` (newest first), each replayed from its events."""
    if not root.is_dir():
        return []
    runs = [path for path in root.iterdir() if (path / LOCK_FILE).is_file()]
    runs.sort(key=lambda path: path.stat().st_mtime, reverse=True)
    return [replay(path) for path in runs[:limit]]
