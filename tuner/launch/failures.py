"""Why a launch failed, told by the ranks themselves where they could speak.

A rank that raised wrote an ``error`` event and, under torch elastic's ``@record``, an ``error.json`` with its
traceback in the launch's elastic log folder: those name the rank, the exception and where it was raised.  A rank
that died without a word (SIGKILL, the OOM killer) is found in torchrun's printed ChildFailedError summary, its
exit code and the "Root Cause (first observed failure)", and shown with the log's last lines.
"""
from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tuner.rundir.events import Error, Event

_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s*(\w+)\s*:\s*(.*)$")
_RANK = re.compile(r"^(\d+) \(local_rank: (\d+)\)")
_EXIT = re.compile(r"^(-?\d+)")
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")  # torch's own warnings
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_DIED = re.compile(r"died with <Signals\.\w+: (\d+)>|returned non-zero exit status (\d+)")
_LAUNCHER = re.compile(r"torch/distributed/elastic/|ChildFailedError|^Traceback \(most recent call last\)")
_CHAINED = "The above exception was the direct cause of the following exception:"
_STDERR_CAUSE = re.compile(r"^RuntimeError(: |$)")


@dataclass(frozen=True)
class RankFailure:
    rank: int
    local_rank: int
    exit_code: int
    host: str = ""
    root_cause: bool = False
    time: str = ""  # torchrun's timestamp of the failure, to the second

    @property
    def signal_name(self) -> str | None:
        if self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code).name
        except ValueError:
            return f"signal {-self.exit_code}"

    def how(self) -> str:
        """What happened to the rank, and the usual reason."""
        name = self.signal_name
        if name is None:
            return f"exited with code {self.exit_code}"
        reason = {
            "SIGKILL": "usually the kernel's out-of-memory killer (check host RAM and `dmesg`) or a job scheduler",
            "SIGSEGV": "a crash in native code, often a kernel built for another torch/CUDA (run `tuner doctor`)",
            "SIGBUS": "shared memory ran out (a container's /dev/shm is often too small)",
            "SIGABRT": "an abort in native code (NCCL or CUDA errors usually print above)",
            "SIGTERM": "stopped from outside, or by the launcher after another rank failed",
        }.get(name, "")
        return f"was killed by {name}" + (f": {reason}" if reason else "")


def first_to_fail(failures: list[RankFailure]) -> list[RankFailure]:
    """``failures`` with the rank whose failure set off the others first.  torchrun's root cause is the earliest
    timestamp, in whole seconds, and a tie goes to the lower local rank; but a rank whose peer was killed fails its
    collective at once and exits with a code, so among failures of the root cause's second one killed by a signal
    (other than the launcher's SIGTERM) came first."""
    if not failures:
        return failures
    root = failures[0]
    killed = [f for f in failures[1:] if f.time == root.time and f.signal_name not in (None, "SIGTERM")]
    if root.signal_name is not None or not killed:
        return failures
    return [killed[0], *(f for f in failures if f is not killed[0])]


def rank_failures(lines: Iterable[str]) -> list[RankFailure]:
    """Every failed rank in torchrun's summary, the one that failed first (:func:`first_to_fail`) first."""
    failures: list[RankFailure] = []
    section: str | None = None  # "failures" or "root" while inside those parts of the summary
    entry: dict[str, str] | None = None

    def close() -> None:
        if entry and section:
            rank, exit_code = _RANK.match(entry.get("rank", "")), _EXIT.match(entry.get("exitcode", ""))
            if rank and exit_code:
                failures.append(RankFailure(int(rank[1]), int(rank[2]), int(exit_code[1]), entry.get("host", ""),
                                            root_cause=section == "root", time=entry.get("time", "")))

    for line in lines:
        text = line.strip()
        if text.startswith(("Failures:", "Root Cause")) or (text and set(text) <= set("=-")):
            close()
            entry = None
            if text.startswith("Failures:"):
                section = "failures"
            elif text.startswith("Root Cause"):
                section = "root"
            elif text.startswith("="):
                section = None
        elif section and _ENTRY.match(line):
            close()
            entry = {}
        elif entry is not None and (match := _FIELD.match(line)):
            entry[match[1]] = match[2].strip()
    close()
    return first_to_fail(sorted(failures, key=lambda failure: (not failure.root_cause, failure.rank)))


def _before_launcher(lines: list[str]) -> list[str]:
    """The ranks' own output: everything before the launcher starts reporting the failure.

    accelerate >= 1.16 raises its CalledProcessError ``from RuntimeError(<the rank's stderr tail>)``: that cause
    prints without a traceback, as ``RuntimeError: <tail>``, before the chained one, and repeats what the rank said."""
    for index, line in enumerate(lines):
        summary = line.strip().startswith("=====") and index + 1 < len(lines) and lines[index + 1].rstrip().endswith("FAILED")
        if line.strip() == _CHAINED:
            return lines[:next((i for i in range(index - 1, -1, -1) if _STDERR_CAUSE.match(lines[i])), index)]
        if summary or _LAUNCHER.search(line):
            return lines[:index]
    return lines


def describe_failure(lines: list[str], exit_code: int, last: int = 15) -> list[str]:
    """Lines for the user: the rank that died first, how, and the last lines it printed."""
    failures = rank_failures(lines)
    if not failures:
        # one process: accelerate's simple launcher reports a killed child as "died with <Signals.SIGKILL: 9>"
        died = next((match for line in reversed(lines) if (match := _DIED.search(line))), None)
        code = (-int(died[1]) if died[1] else int(died[2])) if died else exit_code
        how = RankFailure(0, 0, code).how() if code < 0 else f"exited with code {code}"
        tail = [line.rstrip("\n") for line in _before_launcher(lines) if line.strip()][-last:]
        return [f"training {how}; last lines of the log:", *(f"  {line}" for line in tail)]
    first = failures[0]
    where = f" on {first.host}" if first.host else ""
    message = [f"rank {first.rank} (local rank {first.local_rank}{where}) {first.how()}."]
    others = [f"rank {f.rank}" for f in failures[1:]]
    if others:
        message.append(f"then the launcher stopped {', '.join(others)}.")
    own = [line.rstrip("\n") for line in _before_launcher(lines) if line.strip()  # less other ranks' warnings
           and not ((match := _RANK_PREFIX.match(line)) and int(match[1]) != first.local_rank)]
    message.append("last lines of the log:")
    message.extend(f"  {line}" for line in own[-last:])
    return message


@dataclass(frozen=True)
class RankError:
    """What a rank said as it failed: its ``error`` event, and where the exception was raised (``file:line``,
    from its elastic error file) when it raised one."""
    rank: int
    message: str
    where: str = ""

    def lines(self) -> list[str]:
        return [f"rank {self.rank} failed: {self.message}" + (f" (raised at {self.where})" if self.where else "")]


def rank_errors(events: Iterable[Event], since: float = 0.0) -> list[RankError]:
    """The ``error`` events ranks wrote at or after ``since``, first written first."""
    return [RankError(event.rank or 0, event.message or "")
            for event in events if isinstance(event, Error) and (event.time or 0) >= since]


def raised_at(log_dir: Path, since: float = 0.0) -> dict[str, str]:
    """``file:line`` of the innermost frame of each exception a rank recorded in its elastic ``error.json`` at or
    after ``since`` (a resumed run's folder keeps earlier launches'), keyed by its ``Type: message``, what the
    rank's error event says too."""
    found: dict[str, str] = {}
    for path in sorted(log_dir.glob("*/attempt_*/*/error.json")) if log_dir.is_dir() else ():
        try:
            if path.stat().st_mtime < since:
                continue
            message = json.loads(path.read_text(encoding="utf-8"))["message"]
            stack = message["extraInfo"]["py_callstack"].splitlines()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        frames = [match for line in stack if (match := _FRAME.match(line))]
        if frames:
            found.setdefault(str(message.get("message", "")), f"{frames[-1][1]}:{frames[-1][2]}")
    return found


def explain_failure(errors: list[RankError], where: dict[str, str], lines: list[str], exit_code: int) -> list[str]:
    """The first rank's own error when a rank spoke, unless torchrun saw a rank killed by a signal (its peers'
    errors are then only the echo of its death); otherwise the launcher's summary and the log's tail."""
    killed = any(failure.signal_name not in (None, "SIGTERM") for failure in rank_failures(lines))
    if not errors or killed:
        return describe_failure(lines, exit_code)
    first = errors[0]
    return RankError(first.rank, first.message, where.get(first.message, "")).lines()
