"""The event stream's schema: every kind the ranks write is one dataclass that reads back the lines older tuners
wrote key for key, a kind it does not know never stops a reader, and only tuner.rundir.events names the kinds."""
from __future__ import annotations

import json
import re

import pytest

from conftest import REPO

from tuner.rundir.events import (
    KINDS, Error, EventFollower, Finished, Step, UnknownEvent, describe, parse_event, read_events, write_event,
)

# one line of each kind as tuner wrote them before the schema (keys in their order on disk)
WRITTEN = [
    {"event": "started", "time": 1.5, "max_steps": 4, "world_size": 2, "resumed_from_step": 0, "pid": 11},
    {"event": "step", "time": 2.0, "step": 1, "max_steps": 4, "loss": 4.5, "grad_norm": 1.2, "learning_rate": 0.001,
     "tokens_per_s": 900.0, "samples_per_s": 3.1, "eta_s": 9.0, "peak_rss_gib": 0.6, "peak_rss_gib_per_rank": [0.5, 0.6]},
    {"event": "eval", "time": 2.5, "step": 2, "max_steps": 4, "eval_loss": 2.5, "eval_runtime": 0.1},
    {"event": "checkpoint", "time": 3.0, "step": 2, "path": "runs/demo/checkpoints/checkpoint-2"},
    {"event": "memory", "time": 4.0, "predicted_gib": 1.0, "measured_gib": 0.6, "measured": "peak RSS",
     "peak_rss_gib": 0.6, "line": "plan predicted 1.00 GiB of CPU RAM, measured 0.60 GiB (peak RSS)"},
    {"event": "finished", "time": 4.1, "step": 4, "final_dir": "runs/demo/final", "merged_dir": None, "truncated": None,
     "dropped": None, "train_runtime": 3.2},
    {"event": "error", "time": 5.0, "kind": "out_of_memory", "next_rung": "gradient_checkpointing",
     "message": "out of memory", "rank": 1},
    {"event": "error", "time": 5.0, "message": "ValueError: bad", "rank": 0},
    {"event": "machines", "time": 1.0, "machines": [{"machine_rank": 0, "host": "a"}]},
    {"event": "rank_batch", "time": 1.6, "rank": 1, "pid": 12, "samples": ["ab12"]},
    {"event": "rank_finished", "time": 4.0, "rank": 1, "world_size": 2, "optimizer": "AdamW",
     "parameters_checksum": 1.25, "shapes": {"w": [2, 2]}},
    {"event": "probe_phase", "time": 1.0, "rank": 0, "pid": 11, "phase": "loading", "batch": None},
    {"event": "probe", "time": 1.2, "rank": 0, "pid": 11, "phase": "loading", "device": "cpu", "capacity_gib": 16.0,
     "resets_peak": True, "peak_rss_gib": 0.5, "address_space_gib": 3.0, "current_gib": 0.4},
]


@pytest.mark.parametrize("record", WRITTEN, ids=lambda record: record["event"])
def test_every_kind_reads_back_the_keys_it_was_written_with(record):
    event = parse_event(json.dumps(record))
    assert type(event) is KINDS[record["event"]]
    assert event.to_json() == record and set(event.to_json()) == set(record)


def test_every_kind_written_has_a_line_in_the_examples():
    assert {record["event"] for record in WRITTEN} == set(KINDS)


def test_a_kind_or_a_value_this_version_does_not_know_never_stops_a_reader(tmp_path):
    newer = {"event": "rank_heartbeat", "time": 1.0, "rank": 3}
    event = parse_event(newer)
    assert isinstance(event, UnknownEvent) and event.kind == "rank_heartbeat" and event.to_json() == newer
    assert describe(event) is None
    odd = parse_event({"event": "step", "step": "x", "loss": "nan", "time": "yesterday"})
    assert odd.time is None and odd.number("loss") is None and describe(odd) == "step x/None"
    with pytest.raises(ValueError):
        parse_event({"no": "event"})
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(newer) + "\n[1, 2]\n" + json.dumps(WRITTEN[0]) + "\n{\"event\": \"st")
    assert [e.kind for e in read_events(path)] == ["rank_heartbeat", "started"]


def test_a_written_event_is_followed_as_it_arrives(tmp_path):
    path = tmp_path / "events.jsonl"
    follower = EventFollower(path)
    write_event(path, Step(step=1, max_steps=2, extra={"loss": 1.0}))
    write_event(path, Error(message="boom", rank=0))
    step, error = follower.poll()
    assert describe(step) == "step 1/2  loss 1.0000" and describe(error) == "error: boom"
    assert "kind" not in error.to_json() and follower.poll() == []
    write_event(path, Finished(step=2, final_dir="final"))
    assert [describe(e) for e in follower.poll()] == ["finished: final"]


def test_only_the_schema_names_the_kinds():
    """Writers build the dataclasses: no write_event with a kind spelled as a string, nor a reader comparing one."""
    spelled = re.compile(r"write_event\([^)]*?,\s*\"|\.get\(\"event\"\)|\[\"event\"\]")
    offenders = [str(path.relative_to(REPO)) for path in (REPO / "tuner").rglob("*.py")
                 if path.name != "events.py" and spelled.search(path.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_docs_table_of_events_is_the_one_the_schema_generates():
    from tuner.rundir.events import markdown_table

    doc = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- events: from tuner/rundir/events.py -->\n(.*?)<!-- end events -->", doc, re.S)
    assert block, "docs/training.md must hold the events table"
    assert block[1] == markdown_table(), "regenerate it: python -m tuner.rundir.events"
