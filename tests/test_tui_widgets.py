"""Pure parts of the wizard: the stacked plan bar and the run state folded from events."""
from __future__ import annotations

import json
from pathlib import Path

from tui_helpers import Device, Plan
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


def test_plan_text_shows_verdict_each_device_and_the_legend():
    device = Device("cuda:0 A100-80GB", 79.2, {"weights": 13.0, "optimizer": 52.0, "activations": 20.0})
    text = plan_text(Plan([device, device], "does not fit", missing_gib=5.8, host_ram_gib=120.0), width=40).plain
    assert text.startswith("verdict: does not fit  (5.80 GiB short)")
    assert text.count("cuda:0 A100-80GB  85.00 GiB of 79.20 GiB") == 2
    assert "optimizer 52.00 GiB" in text and "host RAM needed: 120.00 GiB" in text


def test_run_watch_keeps_the_latest_state_and_ignores_an_earlier_run(tmp_path):
    watch = RunWatch(run_dir=tmp_path, since=100.0)
    watch.absorb([
        {"event": "step", "step": 50, "loss": 9.0, "time": 50.0},  # the previous run in this directory
        {"event": "started", "max_steps": 4, "time": 101.0},
        {"event": "step", "step": 1, "max_steps": 4, "loss": 2.0, "tokens_per_s": 10.0, "peak_rss_gib": 0.5, "time": 102.0},
        {"event": "step", "step": 2, "max_steps": 4, "loss": 1.5, "eta_s": 3.0, "time": 103.0},
    ], ["a log line"])
    assert (watch.step, watch.max_steps, watch.losses) == (2, 4, [2.0, 1.5])
    assert watch.memory_gib == {"rss": 0.5} and watch.tokens_per_s == 10.0 and list(watch.log) == ["a log line"]
    watch.absorb([{"event": "step", "step": 3, "max_steps": 4, "peak_allocated_gib": 9.5,
                   "peak_allocated_gib_per_rank": [9.1, 9.5], "time": 104.0}])
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
    statuses = {watch.run_dir.name: watch.status for watch in recent_runs(tmp_path)}
    assert statuses == {"done": "finished", "stopped": "stopped at step 3"}
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
