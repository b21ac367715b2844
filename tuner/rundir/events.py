"""The run's event stream, the contract between the ranks and the launcher: JSON lines written by the training
entrypoint at ``<run dir>/events.jsonl``, read by the CLI, the wizard and the summary.  Pure: no torch, no textual.

Each kind is one frozen dataclass below.  ``to_json`` gives the object on one line: ``event`` (the kind), ``time``,
the declared fields, then ``extra`` flat beside them (what the Trainer logs, memory peaks: keys that vary by run).
:func:`parse_event` reads one back; a kind this version does not know is kept as an :class:`UnknownEvent`, so an
older or newer stream never stops a reader.  :func:`describe` is the one line a person reads of an event (``tuner
run`` and the wizard print the same words).  ``python -m tuner.rundir.events`` prints the table docs/training.md
holds (tests/test_events.py checks they match).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator

from tuner.fileio import open_log

OPTIONAL = {"optional": True}  # a field written only when set (older events lack it; None is never written)


@dataclass(frozen=True, kw_only=True)
class Event:
    """What every line holds: its kind (the ``event`` key) and when it was written (seconds since the epoch)."""
    KIND: ClassVar[str] = ""
    WHO: ClassVar[str] = ""  # which process writes it, for the docs' table
    time: float | None = field(default_factory=lambda: round(time.time(), 3))  # None: a line without one
    extra: dict[str, Any] = field(default_factory=dict)  # the keys beyond the declared fields, as written

    @property
    def kind(self) -> str:
        return self.KIND

    def to_json(self) -> dict[str, Any]:
        declared = {_key(f): getattr(self, f.name) for f in _declared(type(self))
                    if not (f.metadata.get("optional") and getattr(self, f.name) is None)}
        stamp = {} if self.time is None else {"time": self.time}
        return {"event": self.kind, **stamp, **declared, **self.extra}

    @classmethod
    def of(cls, values: dict[str, Any], **common: Any):
        """The event of these JSON keys: the declared fields by their keys, every other key into ``extra``."""
        declared = {_key(f): f.name for f in _declared(cls)}
        return cls(**common, **{declared[key]: value for key, value in values.items() if key in declared},
                   extra={key: value for key, value in values.items() if key not in declared})

    def get(self, key: str, default: Any = None) -> Any:
        """A declared field or an extra key by its JSON name (``default`` when the event lacks it)."""
        if key in self.extra:
            return self.extra[key]
        names = {_key(f): f.name for f in _declared(type(self))}
        value = getattr(self, names[key]) if key in names else None
        return default if value is None else value

    def number(self, key: str) -> float | None:
        """A finite number the event carries under ``key`` (None when absent, or not a number: a damaged line)."""
        value = self.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return value
        return None

    def peaks(self) -> dict[str, Any]:
        """The memory peaks it carries: ``peak_<what>_gib`` (over ranks) and ``peak_<what>_gib_per_rank``."""
        return {key: value for key, value in self.extra.items() if key.startswith("peak_") and "_gib" in key}


@dataclass(frozen=True, kw_only=True)
class Started(Event):
    """Training begins (after the model and data are ready)."""
    KIND, WHO = "started", "rank 0"
    max_steps: int | None = None
    world_size: int | None = None
    resumed_from_step: int | None = None  # 0: a fresh start
    pid: int | None = None


@dataclass(frozen=True, kw_only=True)
class Step(Event):
    """One logged optimizer step; beside its fields, what the Trainer logged (loss, learning_rate, grad_norm; a grpo
    run's reward, reward_std, kl, completions/mean_length), tokens_per_s of real non-padding tokens, samples_per_s,
    eta_s and the memory peaks: peak_allocated_gib and peak_reserved_gib on GPU, peak_rss_gib on CPU, the maximum
    over ranks, with *_per_rank lists beside them with several ranks."""
    KIND, WHO = "step", "rank 0"
    step: int | None = None
    max_steps: int | None = None


@dataclass(frozen=True, kw_only=True)
class Eval(Step):
    """A held-out evaluation: the step's fields with the Trainer's eval_* metrics."""
    KIND = "eval"


@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(Event):
    """The Trainer saved a checkpoint."""
    KIND, WHO = "checkpoint", "rank 0"
    step: int | None = None
    path: str | None = None


@dataclass(frozen=True, kw_only=True)
class Memory(Event):
    """The plan beside the measured peak, at the end (memory.json holds the same), with the peaks per rank."""
    KIND, WHO = "memory", "rank 0"
    predicted_gib: float | None = None
    measured_gib: float | None = None
    measured: str | None = None  # which peak: e.g. "peak reserved on the busiest GPU"
    line: str | None = None


@dataclass(frozen=True, kw_only=True)
class Finished(Event):
    """Training ended and the model is saved, with the Trainer's final metrics (train_runtime, train_loss, eval_*)."""
    KIND, WHO = "finished", "rank 0"
    step: int | None = None
    final_dir: str | None = None
    merged_dir: str | None = None
    truncated: int | None = None  # samples cut to training.max_seq_length (None: not counted, the data was streamed)
    dropped: int | None = None  # samples with no token to learn from


@dataclass(frozen=True, kw_only=True)
class Error(Event):
    """A rank stopped on an error it could name (a recipe, data or model problem; out of memory)."""
    KIND, WHO = "error", "every rank"
    message: str | None = None
    rank: int | None = None
    error_kind: str | None = field(default=None, metadata={**OPTIONAL, "key": "kind"})  # out_of_memory, BAD_INPUT, DISK_FULL
    next_rung: str | None = field(default=None, metadata=OPTIONAL)  # the advisor's next tactic, out of memory


BAD_INPUT = "bad_input"  # an error event's kind when the recipe, data, model or a reward is at fault: exit code 2
DISK_FULL = "disk_full"  # ... when a write (a checkpoint) found the disk full: the message names the path and the room


@dataclass(frozen=True, kw_only=True)
class Machines(Event):
    """Every machine joined the rendezvous with the same libraries and GPUs (multi-machine runs)."""
    KIND, WHO = "machines", "rank 0"
    machines: list[dict] | None = None  # each machine's fingerprint, by machine rank


@dataclass(frozen=True, kw_only=True)
class RankBatch(Event):
    """A rank's first batch, by sample hashes; with TUNER_TRACE_RANKS=1 only (the tests compare ranks by it)."""
    KIND, WHO = "rank_batch", "every rank"
    rank: int | None = None
    pid: int | None = None
    samples: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class RankFinished(Event):
    """A rank's optimizer and its parameters' checksum and shapes at the end of training; with TUNER_TRACE_RANKS=1
    only."""
    KIND, WHO = "rank_finished", "every rank"
    rank: int | None = None
    world_size: int | None = None
    optimizer: str | None = None
    parameters_checksum: float | None = None
    shapes: dict[str, list[int]] | None = None


@dataclass(frozen=True, kw_only=True)
class ProbePhase(Event):
    """tuner probe: a rank starts a measured phase, with its batch."""
    KIND, WHO = "probe_phase", "every rank"
    rank: int | None = None
    pid: int | None = None
    phase: str | None = None
    batch: dict | None = None  # samples, tokens_per_sample, packed, and the text that names it


@dataclass(frozen=True, kw_only=True)
class Probe(Event):
    """tuner probe: a rank measured a phase, with its peaks (peak_rss_gib, address_space_gib; on a GPU
    peak_allocated_gib, peak_reserved_gib, device_gib, outside_allocator_gib) and the training step's
    between_steps_gib and tokens_per_s."""
    KIND, WHO = "probe", "every rank"
    rank: int | None = None
    pid: int | None = None
    phase: str | None = None
    device: str | None = None
    capacity_gib: float | None = None
    resets_peak: bool | None = None


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(Event):
    """A kind this version does not write (an older or newer tuner's): kept whole, shown nowhere."""
    name: str = ""

    @property
    def kind(self) -> str:
        return self.name


KINDS: dict[str, type[Event]] = {cls.KIND: cls for cls in (Started, Step, Eval, CheckpointSaved, Memory, Finished,
                                                           Error, Machines, RankBatch, RankFinished, ProbePhase, Probe)}


def _declared(cls: type[Event]) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(cls) if f.name not in ("time", "extra", "name"))


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def parse_event(line_or_record: str | dict[str, Any]) -> Event:
    """The event of one line (or its decoded object); ValueError when it is not an event object at all."""
    record = json.loads(line_or_record) if isinstance(line_or_record, str) else line_or_record
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        raise ValueError("not an event: no 'event' name")
    cls = KINDS.get(record["event"], UnknownEvent)
    stamp = record.get("time")
    event = cls.of({key: value for key, value in record.items() if key not in ("event", "time")},
                   time=stamp if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else None)
    return dataclasses.replace(event, name=record["event"]) if cls is UnknownEvent else event


def write_event(path: Path, event: Event) -> Event:
    """Append one event (flushed at once so readers see it while the run goes on)."""
    with open_log(path) as stream:
        stream.write(json.dumps(event.to_json(), default=str) + "\n")
    return event


def read_records(path: Path) -> list[dict[str, Any]]:
    """All complete events in the file as written (JSON objects); a partly written last line is skipped."""
    if not path.exists():
        return []
    return list(_records(path.read_text(encoding="utf-8").splitlines()))


def read_events(path: Path) -> list[Event]:
    """All complete events in the file, parsed."""
    return [parse_event(record) for record in read_records(path)]


def _records(lines) -> Iterator[dict[str, Any]]:
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            yield record


class EventFollower:
    """Reads new complete events from a growing events file, remembering its position."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0

    def skip_existing(self) -> None:
        """Follow only what is written from now on (a resumed run appends to its earlier events)."""
        self._offset = self.path.stat().st_size if self.path.exists() else 0

    def poll(self) -> list[Event]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as stream:
            stream.seek(self._offset)
            chunk = stream.read()
        complete, _, _ = chunk.rpartition(b"\n")
        if not complete:
            return []
        self._offset += len(complete) + 1
        return [parse_event(record) for record in _records(complete.decode("utf-8", errors="replace").splitlines())]


# What TRL's GRPOTrainer logs of each round, as grpo runs' step (and, with an eval_ prefix, eval) events carry it
REWARD, REWARD_STD, KL, COMPLETION_LENGTH = "reward", "reward_std", "kl", "completions/mean_length"


def rollout_summary(event: Event, prefix: str = "") -> str:
    """'reward 0.831 ± 0.367  kl 0.0140  completion 6.5 tokens' of a grpo step event ('' for other events); with
    ``prefix="eval_"``, the held-out ones."""
    reward = event.number(prefix + REWARD)
    if reward is None:
        return ""
    spread, kl, length = (event.number(prefix + key) for key in (REWARD_STD, KL, COMPLETION_LENGTH))
    parts = [f"{prefix.replace('_', ' ')}reward {reward:.3f}" + (f" ± {spread:.3f}" if spread is not None else "")]
    if kl is not None:
        parts.append(f"kl {kl:.4f}")
    if length is not None:
        parts.append(f"completion {length:.1f} tokens")
    return "  ".join(parts)


def step_summary(event: Step) -> str:
    """'step 10/100  loss 2.2500  eval_loss 2.5000  900 tok/s  eta 12s' of a step or eval event."""
    parts = [f"step {event.step}/{event.max_steps}"]
    for key, shown in (("loss", "loss {:.4f}"), ("eval_loss", "eval_loss {:.4f}")):
        if event.number(key) is not None:
            parts.append(shown.format(event.number(key)))
    parts += [summary for summary in (rollout_summary(event), rollout_summary(event, "eval_")) if summary]
    for key, shown in (("tokens_per_s", "{:.0f} tok/s"), ("eta_s", "eta {:.0f}s")):
        if event.number(key) is not None:
            parts.append(shown.format(event.number(key)))
    return "  ".join(parts)


def describe(event: Event) -> str | None:
    """The line a person reads of one event (None: the event shows elsewhere, or not at all)."""
    if isinstance(event, Started):
        steps = "?" if event.max_steps is None else event.max_steps
        head = f"started: {steps} steps, {event.world_size or 1} process(es)"
        return head + (f", resuming at step {event.resumed_from_step}" if event.resumed_from_step else "")
    if isinstance(event, Step):  # and Eval
        return step_summary(event)
    if isinstance(event, CheckpointSaved):
        return f"checkpoint saved: {event.path}"
    if isinstance(event, Finished):
        return f"finished: {event.final_dir or 'the final model is saved'}"
    if isinstance(event, Error):
        return f"error: {event.message}"
    if isinstance(event, Probe):
        peak = event.number("device_gib") if event.number("device_gib") is not None else event.number("peak_rss_gib")
        return f"probe: rank {event.rank} measured {event.phase}, peak {peak or 0.0:.3f} GiB"
    return None


def markdown_table() -> str:
    """The docs' table of every event kind: who writes it, its fields and what it says."""
    rows = ["| event | written by | fields | what it says |", "|---|---|---|---|"]
    for kind, cls in KINDS.items():
        names = ", ".join(f"`{_key(f)}`" for f in _declared(cls)) or "-"
        what = " ".join((cls.__doc__ or "").split()).replace("|", "\\|")
        rows.append(f"| `{kind}` | {cls.WHO} | {names} | {what} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
