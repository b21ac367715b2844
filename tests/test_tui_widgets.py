"""Pure parts of the wizard: the stacked plan bar and the run state folded from events."""
from __future__ import annotations

import json
from pathlib import Path

from tui_helpers import device, memory_plan
from tuner.rundir.events import parse_event
from tuner.rundir.summary import summarize_run
from tuner.tui.run_watch import RunWatch, recent_runs
from tuner.tui.widgets.plan_bar import TERM_STYLES, plan_text, stacked_bar


def cells(text, style):
    return sum(span.end - span.start for span in text.spans if str(span.style) == style)


def test_bar_cells_are_proportional_to_capacity():
    bar = stacked_bar({"weights": 2.0, "gradients": 2.0, "optimizer": 0.0}, capacity=8.0, width=16)
    assert bar.plain == "█" * 8 + "░" * 8
    assert cells(bar, TERM_STYLES["weights"]) == 4 and cells(bar, TERM_STYLES["gradients"]) == 4


def test_bar_past_capacity_is_marked_red():
    bar = stacked_bar({"weights": 6.0, "optimizer": 6.0}, capacity=8.0, width=12)
    assert bar.plain == "█" * 12
    assert any("on #5f0000" in str(span.style) and span.start == 8 for span in bar.spans)


def test_bar_without_capacity_is_scaled_to_its_total():
    assert stacked_bar({"weights": 1.0, "overhead": 1.0}, capacity=None, width=10).plain == "█" * 10


def test_plan_text_names_the_short_resource_and_explains_every_bar():
    gpus = device("GPU (8 x A100-80GB)", 79.2, {"weights": 13.0, "optimizer": 12.0, "activations": 4.2}, count=8)
    host = device("host RAM (per machine, 8 GPU(s))", 512.0, {"optimizer": 700.0, "gradients": 118.3}, kind="host")
    text = plan_text(memory_plan([gpus, host], "does not fit", missing_gib=306.3, host_ram_gib=818.3), width=40).plain
    assert text.startswith("verdict: does not fit: host RAM is 306.30 GiB short")
    assert "GPU (8 x A100-80GB), each: 29.20 GiB of 79.20 GiB" in text and "×8" not in text
    legend = [line for line in text.splitlines() if line.startswith("■")]
    assert {"■ gradients 118.30 GiB", "■ optimizer 700.00 GiB"} <= set(legend)  # the host bar's colours too
    assert all(len(line) <= 40 for line in legend)  # packed so that no entry is split


def test_a_bar_of_unknown_capacity_is_not_drawn_full():
    host = device("host RAM (per machine, 1 GPU(s))", None, {"optimizer": 89.7}, kind="host")
    gpu = device("GPU (RTX4090)", 24.0, {"weights": 15.0})
    text = plan_text(memory_plan([gpu, host], "fits", host_ram_gib=89.7), width=30).plain
    assert "89.70 GiB of an unknown capacity" in text and "set Host RAM on the Hardware screen" in text
    assert text.count("█") == round(15 / 24 * 28)  # only the GPU's bar


def test_a_disk_that_cannot_hold_the_checkpoints_is_named():
    from tuner.check import Check

    gpu = device("GPU (RTX4090)", 24.0, {"weights": 15.0})
    disk = Check("disk", "fail", "output runs/x: 3.1 GiB free, checkpoints need ~12.0 GiB")
    assert plan_text(memory_plan([gpu], "fits"), 30, disk).plain.startswith(
        "verdict: fits; disk is short: output runs/x: 3.1 GiB free, checkpoints need ~12.0 GiB")


def test_run_watch_keeps_the_latest_state_and_ignores_an_earlier_run(tmp_path):
    watch = RunWatch(run_dir=tmp_path, since=100.0)
    watch.absorb([parse_event(event) for event in [
        {"event": "step", "step": 50, "loss": 9.0, "time": 50.0},  # the previous run in this directory
        {"event": "started", "max_steps": 4, "time": 101.0},
        {"event": "step", "step": 1, "max_steps": 4, "loss": 2.0, "tokens_per_s": 10.0, "peak_rss_gib": 0.5, "time": 102.0},
        {"event": "step", "step": 2, "max_steps": 4, "loss": 1.5, "eta_s": 3.0, "time": 103.0},
    ]], ["[tuner] data: 190 training samples"])
    assert (watch.step, watch.max_steps, watch.losses) == (2, 4, [2.0, 1.5])
    assert watch.memory_gib == {"rss": 0.5} and watch.tokens_per_s == 10.0
    assert list(watch.log) == ["data: 190 training samples", "started: 4 steps, 1 process(es)",
                               "step 1/4  loss 2.0000  10 tok/s", "step 2/4  loss 1.5000  eta 3s"]
    assert watch.eta_left(now=104.5) == 1.5 and watch.eta_left(now=200.0) == 0.0  # counts down between events
    watch.absorb([parse_event({"event": "step", "step": 3, "max_steps": 4, "peak_allocated_gib": 9.5,
                               "peak_allocated_gib_per_rank": [9.1, 9.5], "time": 104.0})])
    assert watch.memory_gib["allocated"] == 9.5 and watch.memory_per_rank == {"allocated": [9.1, 9.5]}
    watch.finish(0)
    assert watch.status == "finished" and watch.step == 4


def test_recent_runs_replay_their_events(tmp_path):
    for name, events in {"done": ["started", "step", "finished"], "stopped": ["started", "step"]}.items():
        run = tmp_path / name
        run.mkdir()
        (run / "recipe.lock.yaml").write_text("version: 1\n")
        (run / "events.jsonl").write_text("".join(
            json.dumps({"event": kind, "step": 3, "max_steps": 9, "loss": 1.0, "time": 1.0}) + "\n" for kind in events))
    watches = {watch.run_dir.name: watch for watch in recent_runs(tmp_path)}
    assert {name: watch.status for name, watch in watches.items()} == {"done": "finished", "stopped": "stopped at step 3"}
    assert watches["done"].outcome == summarize_run(tmp_path / "done").lines(), "the summary tuner run printed"
    assert watches["stopped"].outcome == []
    assert recent_runs(Path(tmp_path / "missing")) == []


def test_nvidia_smi_output_is_read():
    from tuner.tui.detect import parse_nvidia_smi

    h200 = parse_nvidia_smi("NVIDIA H200, 143771\n")  # as an H200 machine prints it
    assert (h200.count, h200.name, round(h200.memory_gib, 1)) == (1, "NVIDIA H200", 140.4)
    assert h200.recipe_changes() == {"hardware.gpus_per_machine": 1, "hardware.gpu": "H200", "hardware.gpu_memory_gb": None}
    assert parse_nvidia_smi("NVIDIA A100-SXM4-80GB, 81920\n" * 8).count == 8
    assert parse_nvidia_smi("") is None and parse_nvidia_smi("GRID T4, [N/A]") is None


def test_detected_gpus_map_to_the_catalog_by_name_and_memory():
    from tuner.tui.detect import DetectedGpus

    assert DetectedGpus(8, "NVIDIA A100-SXM4-80GB", 79.15).catalog_name() == "A100-80GB"
    assert DetectedGpus(1, "NVIDIA A100-PCIE-40GB", 39.4).catalog_name() == "A100-40GB"
    assert DetectedGpus(1, "NVIDIA H200", 140.4).catalog_name() == "H200"
    assert DetectedGpus(2, "NVIDIA GeForce RTX 4090", 23.99).catalog_name() == "RTX4090"
    assert DetectedGpus(1, "NVIDIA L40S", 44.99).catalog_name() == "L40S"
    odd = DetectedGpus(1, "NVIDIA RTX A6000", 47.99)
    assert odd.catalog_name() is None
    assert odd.recipe_changes() == {"hardware.gpus_per_machine": 1, "hardware.gpu": "48GB", "hardware.gpu_memory_gb": 48.0}


TRAIN_LOG = """\
launching: accelerate launch --config_file runs/demo/accelerate.yaml -m tuner.train runs/demo/recipe.lock.yaml
The following values were not passed to `accelerate launch` and had defaults used instead:
	`--num_cpu_threads_per_process` was set to `2` to improve out-of-box performance when training on CPUs
To avoid this warning pass in values for each of the problematic parameters or run `accelerate config`.

Writing model shards:   0%|          | 0/1 [00:00<?, ?it/s]
tokenising training:  48%|█████     | 92/190 [00:00<00:00, 887.19 examples/s]
[tuner] data: 190 training and 10 held-out instruction samples
{'loss': '4.674', 'grad_norm': '6.891', 'learning_rate': '0', 'epoch': '0.1667'}
[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 3, in <module>
[rank0]:     main()
[rank0]:   File "train.py", line 9, in main
[rank0]:     load()
[rank0]:        ^^^^
[rank0]: ValueError: the data is broken
after the traceback
Traceback (most recent call last):
  File "train.py", line 12, in step
    loss.backward()
KeyboardInterrupt
"""


def test_the_run_log_keeps_what_a_person_reads_not_progress_frames_or_dicts(tmp_path):
    watch = RunWatch(run_dir=tmp_path)
    watch.absorb([], TRAIN_LOG.splitlines())
    assert list(watch.log) == [
        "launching: accelerate launch --config_file runs/demo/accelerate.yaml -m tuner.train runs/demo/recipe.lock.yaml",
        "data: 190 training and 10 held-out instruction samples",
        "Traceback, last frame:", '  File "train.py", line 9, in main', "    load()",
        "ValueError: the data is broken", "after the traceback"]  # the cancel's KeyboardInterrupt is not news
