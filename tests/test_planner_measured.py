"""The planner against real peak memory measured on a GPU (benchmarks/results, made by benchmarks/gpu_check.py).

The committed CSVs hold what an H200 measured cell by cell; this recomputes the current planner's
prediction for every cell (pure arithmetic, no torch) and holds it to the agreement recorded in
benchmarks/results/README.md and docs/memory.md ("Measured on a GPU"): within 10% of the device peak
(max_memory_reserved + memory held outside the allocator) except the documented exceptions, each within
its own bound, and never "fits" for a cell that ran out of memory.  A planner change that breaks the
agreement with real hardware fails here.
"""
from __future__ import annotations

import statistics
from functools import cache
from pathlib import Path

import pytest

from benchmarks.gpu_report import OK, OOM, TOLERANCE_PCT, add_predictions, read_results

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
MEASURED = {"full": RESULTS / "gpu-check_2026-11-30_NVIDIA-H200.csv",
            "quick": RESULTS / "gpu-check_2026-11-29_NVIDIA-H200_quick.csv"}
MEDIAN_ABS_ERROR_PCT = 3.0  # the full matrix's median |error| (2.3% when recorded)

# Documented limitations (docs/memory.md, "Measured on a GPU"): full fine-tuning of the small models, where
# the first optimizer step's lazily created AdamW states land in (or beside) the cached loss segments, so how
# much the allocator reserves beyond the live tensors depends on how parameter-shaped blocks tile T x V ones.
# label -> (lowest, highest) error % allowed; recorded values in the comment.
EXCEPTIONS = {
    "Qwen2.5-1.5B full no-gc s512 sdpa mb4": (-17.0, TOLERANCE_PCT),  # -14.7
    "Qwen2.5-1.5B full no-gc s2048 sdpa mb1": (-17.0, TOLERANCE_PCT),  # -14.0
    "Qwen2.5-1.5B full no-gc s2048 sdpa mb4": (-TOLERANCE_PCT, 14.0),  # +11.2
    "Qwen2.5-0.5B full no-gc s2048 sdpa mb4": (-TOLERANCE_PCT, 23.0),  # +19.5
    "Qwen2.5-0.5B full gc s2048 sdpa mb4": (-TOLERANCE_PCT, 25.0),  # +21.9
}


@cache
def predicted(name: str) -> tuple:
    """The measured results of ``name`` with the current planner's predictions."""
    results, note = add_predictions(read_results(MEASURED[name]))
    assert note is None, note
    return tuple(results)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_every_measured_cell_is_predicted_within_tolerance_or_its_documented_bound(name):
    results = predicted(name)
    compared = [r for r in results if r.status == OK]
    assert compared and all(r.error_pct is not None for r in compared)
    off = []
    for r in compared:
        low, high = EXCEPTIONS.get(r.cell.label, (-TOLERANCE_PCT, TOLERANCE_PCT))
        if not low <= r.error_pct <= high:
            off.append(f"{r.cell.label}: {r.error_pct:+.1f}% (allowed {low:+g} .. {high:+g}; "
                       f"predicted {r.predicted_gib:.2f} GiB, measured {r.device_peak_gib:.2f})")
    assert not off, "\n".join(off)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_no_cell_that_ran_out_of_memory_is_predicted_to_fit(name):
    results = predicted(name)
    oom = [r for r in results if r.status == OOM]
    assert all(r.predicted_fit is False for r in oom), [r.cell.label for r in oom if r.predicted_fit]
    assert all(r.predicted_fit for r in results if r.status == OK)  # and every cell that ran fits on paper


def test_full_matrix_median_error_stays_small():
    results = predicted("full")
    assert len([r for r in results if r.status == OOM]) == 3  # the eager s2048 mb4 cells of the 8B
    median = statistics.median(abs(r.error_pct) for r in results if r.status == OK)
    assert median <= MEDIAN_ABS_ERROR_PCT
