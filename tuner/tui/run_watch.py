"""What the Run screen shows of a launched run, folded from its events and log lines.

The Run screen's log is event-driven: one readable line per event (the same words ``tuner run``
prints), the run contract's and tuner's own lines, warnings and errors; progress-bar frames, the
Trainer's raw dicts and launcher chatter stay in ``train.log``.

Pure Python (no textual): the app's worker feeds it, the screen reads it; a finished
run's events file replays into the same state.
"""
from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tuner.rundir.events import Error, Eval, Event, Finished, Started, Step, describe, read_events, rollout_summary
from tuner.rundir.layout import EVENTS_FILE, LOCK_FILE
from tuner.rundir.lock import RunLock, RunLocked
from tuner.rundir.summary import summarize_run

LOG_LINES = 400
STOPPING = "stopping every rank…"
TUNER_PREFIX = "[tuner] "
NOISE = re.compile("|".join((
    r"\d+%\|",  # a tqdm frame: "Loading weights:  50%|#####     | 19/38 [00:00<00:00, ...]"
    r"^\{'.*\}$",  # the Trainer's log dict; the step events carry the same numbers
    r"^The following values were not passed to `accelerate launch`",  # accelerate's notice about defaults
    r"^\s+`--\w+` was set to",
    r"^To avoid this warning pass in values",
    r"real_accelerator\.py.*Setting accelerator to CPU",  # DeepSpeed finding no GPU on a CPU run
)))
RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")  # torchrun's tee of each rank's output


@dataclass
class RunWatch:
    run_dir: Path
    live: bool = False  # launched from this wizard (a replayed run is not)
    kind: str = "run"  # run, or probe (tuner probe: a few measured steps; it ends "measured", not "finished")
    plan: Any = None  # the memory plan the run was launched with, to compare measured memory against
    status: str = "starting"
    step: int = 0
    max_steps: int | None = None
    losses: list[float] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)
    rollout: str = ""  # grpo: the last logged round's reward, its spread, KL and completion length
    tokens_per_s: float | None = None
    eta_s: float | None = None
    eta_at: float | None = None  # when eta_s was measured (the event's time): the ETA counts down from there
    memory_gib: dict[str, float] = field(default_factory=dict)  # peak over ranks, e.g. {"allocated": 12.1}
    memory_per_rank: dict[str, list[float]] = field(default_factory=dict)  # with several ranks
    final_dir: str | None = None
    error: str | None = None
    cancelled: bool = False
    outcome: list[str] = field(default_factory=list)  # how it ended, or why it did not start (tuner.launch.run)
    can_override: bool = False  # refused by a check the user may override ("Launch anyway")
    exit_code: int | None = None
    log: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    logged: int = 0  # lines ever added to ``log`` (it keeps the last LOG_LINES): what a reader has not seen yet
    since: float = 0.0  # events older than the launch belong to an earlier run in the same directory
    traceback: list[str] | None = None  # the frames of a traceback being read
    clock: Callable[[], float] = field(default=time.time, repr=False, compare=False)  # now (a test fixes it)

    @property
    def running(self) -> bool:
        return self.live and self.exit_code is None

    def eta_left(self, now: float | None = None) -> float | None:
        """Seconds left: the last measured ETA, counted down since it was measured."""
        if self.eta_s is None or self.eta_at is None:
            return None
        return max(self.eta_s - ((now or self.clock()) - self.eta_at), 0.0)

    def absorb(self, events: list[Event], log_lines: list[str] = ()) -> None:
        for line in log_lines:
            self._take_log_line(line)
        for event in events:
            if event.time is not None and event.time < self.since:
                continue
            if event.number("step") is not None:
                self.step = int(event.number("step"))
            if event.number("max_steps"):
                self.max_steps = int(event.number("max_steps"))
            running = "running" if not self.cancelled else STOPPING
            if isinstance(event, Started):  # a run directory's next run (a resume, or a new run after one)
                self.status, self.step, self.error = running, int(event.resumed_from_step or 0), None
            elif isinstance(event, Eval):
                if event.number("eval_loss") is not None:
                    self.eval_losses.append(event.number("eval_loss"))
            elif isinstance(event, Step):
                self.status = running
                if event.number("loss") is not None:
                    self.losses.append(event.number("loss"))
                self.rollout = rollout_summary(event) or self.rollout
            elif isinstance(event, Finished):
                self.final_dir = event.final_dir
            elif isinstance(event, Error):
                self.error = str(event.message)
            if event.number("tokens_per_s") is not None:
                self.tokens_per_s = event.number("tokens_per_s")
            if event.number("eta_s") is not None:
                self.eta_s, self.eta_at = event.number("eta_s"), event.time if event.time is not None else self.clock()
            for key, value in event.peaks().items():
                if key.endswith("_gib"):
                    self.memory_gib[key.removeprefix("peak_").removesuffix("_gib")] = float(value)
                elif key.endswith("_gib_per_rank"):
                    self.memory_per_rank[key.removeprefix("peak_").removesuffix("_gib_per_rank")] = list(value)
            line = describe(event)
            if line:
                self._log(line)

    def _take_log_line(self, line: str) -> None:
        """Keep what a person reads: tuner's lines (the run contract's and the trainer's), warnings and failures.

        Dropped: progress-bar frames, the Trainer's raw dicts (the events say the same), blank lines and
        launcher chatter about defaults tuner sets on purpose.  A traceback is shortened to its last frame
        and exception (train.log has it whole); one that ends in KeyboardInterrupt is the cancel the
        status already says.
        """
        line = RANK_PREFIX.sub("", line.rstrip())
        if self.traceback is not None:
            if line.startswith((" ", "\t")) or not line:
                self.traceback.append(line)
                return
            frames, self.traceback = [frame for frame in self.traceback if frame.strip()], None
            if line != "KeyboardInterrupt":
                last = [frame for frame in frames if frame.lstrip().startswith("File ")][-1:]
                where = frames[frames.index(last[0]):][:2] if last else []
                self._log("Traceback, last frame:", *where, line)
            return
        if line.startswith("Traceback (most recent call last)"):
            self.traceback = []
        elif line.strip() and not NOISE.search(line):
            self._log(line.removeprefix(TUNER_PREFIX))

    def _log(self, *lines: str) -> None:
        self.log.extend(lines)
        self.logged += len(lines)

    def log_since(self, seen: int) -> tuple[list[str], bool]:
        """The lines added after the first ``seen`` ever logged, and whether some of them are gone already (more
        than LOG_LINES since: the reader starts again from what the log still holds).  A count of lines, not an
        index into ``log``: once it is full its length stays LOG_LINES while lines keep coming."""
        new = self.logged - seen
        if new > len(self.log) or new < 0:
            return list(self.log), True
        return list(self.log)[len(self.log) - new:], False

    def cancel(self) -> None:
        """Asked to stop (every rank gets SIGINT, then harder): said so until the exit is reported."""
        self.cancelled, self.status = True, STOPPING

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
            self.status = "finished" if self.kind == "run" else "measured"
            if self.max_steps:
                self.step = self.max_steps
        else:
            self.status = f"failed (exit code {exit_code})"


def holder_of(run_dir: Path) -> str | None:
    """Who runs ``run_dir`` now, as its lock says (the lock ``tuner run`` and this wizard hold while a run goes):
    "" for a live process on this host, the host's name for one elsewhere (it cannot be checked from here), None
    when nobody does (no lock, or its process is gone)."""
    try:
        holder = RunLock(run_dir).holder()
    except RunLocked:  # not a lock file tuner wrote
        return None
    if holder is None or holder.pid <= 0:
        return None
    alive = holder.alive()
    return None if alive is False else "" if alive else holder.host


def replay(run_dir: Path) -> RunWatch:
    """The state of a run from its lock and events file, as ``tuner run`` leaves them (Recent runs, and the Run
    screen of a run opened there): a finished one ends with the summary ``tuner run`` printed; one whose lock is
    held by a live process is running, at the step its events reached; one nobody holds any more stopped there."""
    watch = RunWatch(run_dir=run_dir, status="not started")
    events = read_events(run_dir / EVENTS_FILE)
    watch.absorb(events)
    last_start = next((event.time for event in reversed(events) if isinstance(event, Started)), None)
    summary = summarize_run(run_dir, since=last_start or 0.0, events=events)
    holder = holder_of(run_dir)
    if summary is not None:
        watch.status, watch.outcome = "finished", summary.lines()
    elif holder is not None:
        watch.status = f"running on {holder}" if holder else "running"
    elif isinstance(events[-1] if events else None, Error) or watch.error:
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
