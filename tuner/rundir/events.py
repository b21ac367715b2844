"""The run's event stream: JSON lines written by the training entrypoint, read by the CLI and the TUI.

One object per line with an ``event`` name (started, step, eval, checkpoint, finished, error)
and a ``time``; the file lives at ``<run dir>/events.jsonl``.  Pure: no torch, no textual.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator


def write_event(path: Path, event: str, /, **fields: Any) -> dict[str, Any]:
    """Append one event (flushed at once so readers see it while the run goes on)."""
    record = {"event": event, "time": round(time.time(), 3), **fields}
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(json.dumps(record, default=str) + "\n")
    return record


def read_events(path: Path) -> list[dict[str, Any]]:
    """All complete events in the file; a partly written last line is skipped."""
    if not path.exists():
        return []
    return list(_parse(path.read_text(encoding="utf-8").splitlines()))


def _parse(lines) -> Iterator[dict[str, Any]]:
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "event" in record:
            yield record


class EventFollower:
    """Reads new complete events from a growing events file, remembering its position."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0

    def skip_existing(self) -> None:
        """Follow only what is written from now on (a resumed run appends to its earlier events)."""
        self._offset = self.path.stat().st_size if self.path.exists() else 0

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as stream:
            stream.seek(self._offset)
            chunk = stream.read()
        complete, _, _ = chunk.rpartition(b"\n")
        if not complete:
            return []
        self._offset += len(complete) + 1
        return list(_parse(complete.decode("utf-8", errors="replace").splitlines()))


# What TRL's GRPOTrainer logs of each round, as grpo runs' step (and, with an eval_ prefix, eval) events carry it
REWARD, REWARD_STD, KL, COMPLETION_LENGTH = "reward", "reward_std", "kl", "completions/mean_length"


def rollout_summary(event: dict[str, Any], prefix: str = "") -> str:
    """'reward 0.831 ± 0.367  kl 0.0140  completion 6.5 tokens' of a grpo step event ('' for other events); with
    ``prefix="eval_"``, the held-out ones."""
    reward = event.get(prefix + REWARD)
    if not isinstance(reward, (int, float)):
        return ""
    parts = [f"{prefix.replace('_', ' ')}reward {reward:.3f}" + (
        f" ± {event[prefix + REWARD_STD]:.3f}" if isinstance(event.get(prefix + REWARD_STD), (int, float)) else "")]
    if isinstance(event.get(prefix + KL), (int, float)):
        parts.append(f"kl {event[prefix + KL]:.4f}")
    if isinstance(event.get(prefix + COMPLETION_LENGTH), (int, float)):
        parts.append(f"completion {event[prefix + COMPLETION_LENGTH]:.1f} tokens")
    return "  ".join(parts)
