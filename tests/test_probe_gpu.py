"""The probe's CUDA path: torch's allocator statistics per phase, and a real probe on one GPU beside the plan.

Runs only where torch finds a CUDA device (skipped otherwise); ``bash benchmarks/gpu_smoke.sh`` probes the demo on a
GPU through the command line as well.
"""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GIB = 2**30


def test_a_phase_peak_is_torchs_peak_since_the_last_reset_at_three_levels():
    from tuner.train.probe import PhaseMeter

    meter = PhaseMeter()
    assert meter.gpu
    meter.reset()
    big = torch.empty(GIB // 2, dtype=torch.uint8, device="cuda")
    del big
    first = meter.peak()
    assert first["peak_allocated_gib"] >= 0.5
    assert first["peak_allocated_gib"] <= first["peak_reserved_gib"] <= first["device_gib"]
    assert first["outside_allocator_gib"] > 0  # the CUDA context at least
    torch.cuda.empty_cache()
    meter.reset()
    small = torch.empty(GIB // 16, dtype=torch.uint8, device="cuda")
    second = meter.peak()
    assert 1 / 16 <= second["peak_allocated_gib"] < first["peak_allocated_gib"]
    assert meter.current() == pytest.approx(small.numel() / GIB, abs=0.01)
    name, capacity = meter.device()
    assert name == torch.cuda.get_device_name() and capacity > 1


@pytest.mark.slow
def test_the_demo_probed_on_one_gpu_is_compared_at_every_level(tmp_path, tuner_cli, demo_model_path):
    memory_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    result = tuner_cli("probe", "demo", "--set", "hardware.gpus_per_machine=1", "--set",
                       f"hardware.gpu_memory_gb={memory_gb:.0f}", "--set", "data.max_samples=300",
                       cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "runs" / "demo" / "probe" / "probe.json").read_text())
    step = report["ranks"]["0"]["training step"]
    assert step["device"] == torch.cuda.get_device_name(0)
    assert 0 < step["peak_allocated_gib"] <= step["peak_reserved_gib"] <= step["device_gib"]
    levels = {row["level"] for row in report["phases"] if row["what"] == "training step"}
    assert levels == {"allocated", "reserved", "device"}
    assert all(row["planned_gib"] and row["error"] is not None for row in report["phases"]
               if row["what"] == "training step")
    groups = {row["what"].split(" (")[0] for row in report["term_groups"]}
    assert groups == {"outside the allocator", "model states", "step transients", "allocator cache"}
    assert report["peak"]["rank"] == 0 and report["peak"]["what"].startswith("peak GPU memory")
