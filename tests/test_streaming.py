"""Streamed data (data.streaming: true): read and tokenised as training goes, for data larger than RAM.

`tuner run` still checks every row before it launches, reading the file through once a batch at a time (a bad row
deep in the file is named by its line); training reads the stream for max_steps steps and nothing is prepared or
cached up front.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tuner.data.prepare import check_data, split_samples
from tuner.data.sources import DataError
from tuner.rundir.events import read_records
from tuner.recipe.io import validate_recipe


def write_pairs(path: Path, rows: int, bad_at: int | None = None) -> Path:
    """``rows`` instruction samples of the demo's word-reversal task, one a line; the row ``bad_at`` (from 1) has an
    empty output."""
    with path.open("w") as out:
        for row in range(1, rows + 1):
            word = "".join("abcdefghij"[int(digit)] for digit in str(row)) + "xyz"[: row % 4]  # one word a row
            output = "" if row == bad_at else word[::-1]
            out.write(json.dumps({"instruction": f"reverse: {word}", "output": output}) + "\n")
    return path


def streaming_recipe(path: Path, **data):
    return validate_recipe({
        "model": {"id": "builtin:demo", "dtype": "float32"},
        "memory": {"mixed_precision": "no", "max_seq_length": 64},
        "data": {"source": str(path), "eval_fraction": 0, "streaming": True, **data},
        "training": {"max_steps": 3},
    })


def test_a_bad_row_deep_in_a_stream_is_refused_by_its_line_before_launch(tmp_path, capsys, monkeypatch):
    from tuner.cli import main

    path = write_pairs(tmp_path / "big.jsonl", 12_000, bad_at=11_123)  # past the first batch checked
    with pytest.raises(DataError, match=r"big\.jsonl:11123: 'output' is missing or empty"):
        check_data(streaming_recipe(path))
    monkeypatch.chdir(tmp_path)
    settings = [f"data.source={path}", "data.eval_fraction=0", "data.streaming=true", "training.max_steps=3"]
    assert main(["run", "demo", *[arg for s in settings for arg in ("--set", s)]]) == 2
    assert f"error: data.source: {path}:11123: 'output' is missing or empty" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists(), "refused before anything is written"
    summary = check_data(streaming_recipe(write_pairs(tmp_path / "good.jsonl", 12_000)))
    assert (summary.train, summary.held_out, summary.data_format, summary.streamed) == (12_000, 0, "instruction", True)
    assert check_data(streaming_recipe(tmp_path / "good.jsonl", max_samples=100)).train == 100


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_csv_and_parquet_streams_are_checked_batch_by_batch(suffix, tmp_path, monkeypatch):
    import datasets

    import tuner.data.prepare as prepare

    monkeypatch.setattr(prepare, "_CHECK_BATCH", 100)
    rows = [{"instruction": f"reverse: w{i}", "output": "" if i == 250 else f"{i}w"} for i in range(300)]
    path = tmp_path / f"rows{suffix}"
    getattr(datasets.Dataset.from_list(rows), "to_csv" if suffix == ".csv" else "to_parquet")(str(path))
    where = r"rows\.csv:252" if suffix == ".csv" else r"rows\.parquet: row 251"  # the csv's header is line 1
    with pytest.raises(DataError, match=where + r": 'output' is missing or empty"):
        check_data(streaming_recipe(path))


def test_the_stream_check_holds_no_row_list(tmp_path, monkeypatch):
    """The scan before launch keeps a count, not a list of every row's line: a clean file is scanned once, and the
    rows are read a batch at a time (never the whole stream in memory)."""
    import tuner.data.prepare as prepare
    import tuner.data.sources as sources

    path = write_pairs(tmp_path / "rows.jsonl", 5_000)
    scans, batches = [], []
    real_scan, real_batches = sources.row_lines, prepare.column_batches

    def counted_scan(*args):
        scans.append(args)
        return real_scan(*args)

    def seen_batches(*args):
        for batch in real_batches(*args):
            batches.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(sources, "row_lines", counted_scan)
    monkeypatch.setattr(prepare, "_CHECK_BATCH", 1_000)
    monkeypatch.setattr(prepare, "column_batches", seen_batches)
    samples, data_format = prepare.load_samples(streaming_recipe(path))
    assert samples.rows == 5_000 and not hasattr(samples, "lines")
    assert prepare.check_samples(samples, data_format) == 5_000
    assert len(scans) == 1, "a clean file is scanned once"
    assert sum(batches) == 5_000 and max(batches) <= 1_000

    import tracemalloc

    monkeypatch.undo()
    path = write_pairs(tmp_path / "more.jsonl", 20_000)
    tracemalloc.start()
    try:
        assert sum(1 for _ in sources.row_lines(path, "json", str(path))) == 20_000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 2**10, f"the scan held {peak} bytes (a list of 20,000 lines is about 0.7 MiB)"


def test_a_stream_is_shuffled_within_its_buffer_and_cut_to_max_samples(tmp_path):
    path = write_pairs(tmp_path / "rows.jsonl", 50)
    train, held_out, _ = split_samples(streaming_recipe(path, max_samples=20))
    first = [row["instruction"] for row in train]
    assert held_out is None and len(first) == 20
    assert first == [row["instruction"] for row in split_samples(streaming_recipe(path, max_samples=20))[0]]
    in_file = [json.loads(line)["instruction"] for line in path.read_text().splitlines()]
    assert first != in_file[:20], "shuffled with the seed"


def first_lines_only(monkeypatch) -> None:
    """Fail the test when anything scans a stream further than its first lines."""
    import tuner.data.sources as sources

    scan = sources.row_lines

    def bounded(path, loader, source, until=None):
        assert until == sources.FIRST_LINES_SCANNED, "the whole stream was scanned"
        return scan(path, loader, source, until)

    monkeypatch.setattr(sources, "row_lines", bounded)


def test_preview_of_a_stream_shows_its_first_samples_scanning_only_its_first_lines(tmp_path, capsys, monkeypatch):
    """Preview reads a stream's first samples after scanning its first lines only: a bad row far down the file is
    left to `tuner run`'s whole check, a first row that is not a sample is refused by its line (pyarrow's reader
    would die on a null one)."""
    from tuner.cli import main

    first_lines_only(monkeypatch)
    path = write_pairs(tmp_path / "rows.jsonl", 30_000, bad_at=20_000)
    settings = [f"data.source={path}", "data.eval_fraction=0", "data.streaming=true", "training.max_steps=3",
                "data.format=auto"]
    sets = [arg for s in settings for arg in ("--set", s)]
    assert main(["data", "preview", "demo", "-n", "2", *sets]) == 0
    out = capsys.readouterr().out
    assert "format: instruction" in out and out.count("sample ") == 2 and "reverse: " in out

    path.write_text("null\n" + path.read_text())
    assert main(["data", "preview", "demo", "-n", "2", *sets]) == 2
    assert f"{path}:1: a JSON null, not an object" in capsys.readouterr().err


def test_inference_learns_a_streamed_runs_shared_instruction_from_its_first_samples(tmp_path, monkeypatch):
    from tuner.infer.prompt_format import trained_prompt_format

    first_lines_only(monkeypatch)
    path = tmp_path / "shared.jsonl"
    path.write_text("".join(json.dumps({"instruction": "reverse", "input": f"w{i}", "output": f"{i}w"}) + "\n"
                            for i in range(3000)))
    assert trained_prompt_format(streaming_recipe(path)).instruction == "reverse"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.xdist_group("ranks"))])
def test_tuner_run_trains_on_a_stream_and_prepares_nothing(processes, tmp_path, tuner_cli, demo_model_path):
    home = tmp_path / "home"
    path = write_pairs(tmp_path / "rows.jsonl", 400)
    settings = [f"model.id={demo_model_path}", f"data.source={path}", "data.streaming=true", "data.eval_fraction=0",
                "data.format=instruction", "training.max_steps=4", "training.warmup_steps=0", "training.logging_steps=1",
                "training.micro_batch_size=8", f"hardware.num_processes={processes}",
                f"hardware.main_process_port={free_port()}", "name=stream",
                *(["memory.distributed=ddp"] if processes > 1 else ["data.packing=true"])]  # packing: a collator
    result = tuner_cli("run", "demo", *[arg for s in settings for arg in ("--set", s)], cwd=tmp_path,
                       env={"TUNER_HOME": str(home), "TUNER_TRACE_RANKS": "1"}, timeout=300)
    run_dir = tmp_path / "runs" / "stream"
    log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + log[-3000:]
    assert "data: 400 instruction samples, streamed" in result.stderr + result.stdout
    events = read_records(run_dir / "events.jsonl")
    losses = [e["loss"] for e in events if e["event"] == "step" and "loss" in e]
    finished = events[-1]
    assert finished["event"] == "finished" and finished["step"] == 4
    assert len(losses) == 4 and all(loss == loss and loss < 100 for loss in losses) and losses[-1] < losses[0]
    assert finished["truncated"] is None and finished["dropped"] is None
    assert "were not counted (the data was streamed)" in result.stdout
    assert not (home / "prepared").exists(), "a stream is never prepared or cached"
    batches = {e["rank"]: set(e["samples"]) for e in events if e["event"] == "rank_batch"}
    assert sorted(batches) == list(range(processes))
    assert processes == 1 or not batches[0] & batches[1], "both ranks read the same samples: not data parallel"
