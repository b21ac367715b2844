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
