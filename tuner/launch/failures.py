"""Why a launch failed: which rank died, how, and its last log lines, read from the launch's own output.

torchrun (under ``accelerate launch``) ends a failed run with a ChildFailedError summary naming each
rank's exit code and the "Root Cause (first observed failure)"; with ``--tee 3`` every line a rank
prints is prefixed ``[<role><local rank>]:``.  Pure: text in, lines for the user out.
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Iterable

_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s*(\w+)\s*:\s*(.*)$")
_RANK = re.compile(r"^(\d+) \(local_rank: (\d+)\)")
_EXIT = re.compile(r"^(-?\d+)")
_RANK_PREFIX = re.compile(r"^\[[A-Za-z_]+(\d+)\]:")  # torchrun --tee: [default1]:, torch's warnings: [rank1]:
_TEE_PREFIX = re.compile(r"^\[(?!rank\d)[A-Za-z_]+\d+\]:")
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


def lines_of_rank(lines: Iterable[str], local_rank: int) -> list[str]:
    """What one rank printed, from a log whose lines carry torchrun's ``[role<N>]:`` prefix."""
    found = []
    for line in lines:
        match = _RANK_PREFIX.match(line)
        if match and int(match[1]) == local_rank and line[match.end():].strip():
            found.append(line[match.end():].rstrip("\n"))
    return found


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
    own = lines_of_rank(lines, first.local_rank)
    if own and any(_TEE_PREFIX.match(line) for line in lines):
        message.append(f"last lines of rank {first.rank}:")
    else:  # without --tee only torch's own "[rankN]:" lines carry a rank: show the rest, less other ranks' lines
        own = [line.rstrip("\n") for line in _before_launcher(lines) if line.strip()
               and not ((match := _RANK_PREFIX.match(line)) and int(match[1]) != first.local_rank)]
        message.append("last lines of the log:")
    message.extend(f"  {line}" for line in own[-last:])
    return message
