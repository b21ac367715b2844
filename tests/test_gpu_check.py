"""benchmarks/gpu_check: refusal without CUDA, the cell matrix, and the report code on recorded results."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_cells import unrunnable
from benchmarks.gpu_check import BUDGET_S, free_stem, main
from benchmarks.gpu_matrix import (METHODS, MODELS, REFERENCE, Cell, build_recipe, catalog_gpu, estimate_seconds,
                                   full_matrix, quick_matrix, round_three_full, round_three_quick)
from benchmarks.gpu_tactics import HELD_OUT, TACTICS
from benchmarks.gpu_report import (MARKDOWN_HEADER, Prediction, add_predictions, baseline_text, read_results, results_csv, results_markdown,
                                   results_stem, summarize, summary_text)
from tuner.catalog.gpus import GPUS
from tuner.recipe.checks import find_problems

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "tests" / "data" / "gpu_check_sample.csv"
H200_TFLOPS = GPUS["H200"].peak_bf16_tflops
H100_TFLOPS = GPUS["H100-80GB"].peak_bf16_tflops
ROUND_THREE_CSV = REPO / "benchmarks" / "results" / "gpu-check_2026-11-30_NVIDIA-H200.csv"


@pytest.mark.slow
def test_refuses_cleanly_without_cuda():
    results = REPO / "benchmarks" / "results"
    before = set(results.iterdir())
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--quick"], cwd=REPO, capture_output=True, text=True,
        timeout=120, env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.returncode == 2
    assert "finds no CUDA device" in result.stderr
    assert "Traceback" not in result.stderr
    assert set(results.iterdir()) == before


@pytest.mark.parametrize("argv", [[], ["--quick"], ["--round", "3"], ["--round", "3", "--quick"], ["--budget-s", "60"]])
def test_every_measuring_mode_refuses_in_one_line_without_cuda(argv, capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so that a GPU machine refuses too
    assert main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: gpu_check measures on an NVIDIA GPU")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["--round", "5"], ["--budget-s", "soon"], ["--quick", "extra"]])
def test_bad_arguments_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and "gpu_check: error:" in capsys.readouterr().err


# ---- the matrix --------------------------------------------------------------------------------

def test_round_three_covers_every_factor_for_every_model_within_six_minutes():
    cells = round_three_full()
    assert len(cells) == len(set(cells)) == 90
    for model in MODELS:
        mine = [cell for cell in cells if cell.model == model]
        assert {c.method for c in mine} == set(METHODS)
        assert {c.gradient_checkpointing for c in mine} == {False, True}
        assert {c.seq_len for c in mine} == {512, 2048}
        assert {c.attention for c in mine} == {"sdpa", "eager"}
        assert {c.micro_batch for c in mine} == {1, 4}
    assert estimate_seconds(cells, H200_TFLOPS) < 300
    assert [cell.model for cell in cells][0] == "meta-llama/Llama-3.1-8B"  # largest first: a short budget drops small cells


def test_round_three_quick_fits_two_minutes_and_still_has_each_method():
    cells = round_three_quick()
    assert set(cells) <= set(round_three_full())
    assert {c.method for c in cells} == set(METHODS)
    assert {c.model for c in cells} == set(MODELS)
    assert estimate_seconds(cells, H200_TFLOPS) < 100


def test_round_four_has_every_tactic_the_issue_names_and_fits_its_budget_on_an_h100():
    cells, quick = full_matrix(), quick_matrix()
    assert len(cells) == len(set(cells)) and cells[0] == REFERENCE
    assert {cell.tactic for cell in cells} == set(TACTICS)
    assert set(quick) < set(cells)
    assert {"transformers-defaults", "tuner-tactics", "zero3", "fsdp2", "dpo", "grpo", "image-text"} <= {
        cell.tactic for cell in quick}
    baselines = [cell for cell in cells if cell.tactic == "transformers-defaults"]
    assert {(cell.method, cell.layers) for cell in baselines} == {("lora", None), ("full", 8)}
    for baseline in baselines:  # each beside its tuner-tactics twin: the same shape, batch and sequence
        twin = Cell(**{**baseline.__dict__, "tactic": "tuner-tactics", "gradient_checkpointing": True,
                       "attention": "auto"})
        assert twin in cells and not baseline.gradient_checkpointing
    for tactic in ("liger", "chunked-loss", "activation-offload", "packing", "compile", "flash"):
        on = next(cell for cell in cells if cell.tactic == tactic)
        assert Cell(**{**on.__dict__, "tactic": "none", "attention": "sdpa"}) == REFERENCE  # the reference is its off
    assert {cell.seq_len for cell in cells if cell.method == "qlora"} == {4096, 16384}
    assert {(cell.method, cell.tactic) for cell in cells if cell.model == "Qwen/Qwen3-30B-A3B"} == {
        ("full", "none"), ("lora", "lora-experts")}
    # the budget stops starting cells; the estimate leaves the last cells (and the estimate's error) room
    assert estimate_seconds(cells, H100_TFLOPS) < BUDGET_S[False] - 30 < 9 * 60
    assert estimate_seconds(quick, H100_TFLOPS) < BUDGET_S[True] - 20 < 4 * 60
    assert set(HELD_OUT) <= set(TACTICS)


def test_cells_without_their_package_are_skipped_with_the_reason(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    flash = next(cell for cell in full_matrix() if cell.tactic == "flash")
    assert unrunnable(flash) == "skipped: flash_attn is not importable (its sdpa twin is the reference cell)"
    grpo_vllm = next(cell for cell in full_matrix() if cell.tactic == "grpo-vllm")
    assert unrunnable(grpo_vllm) == "skipped: trl, datasets, vllm are not importable"
    assert unrunnable(REFERENCE) is None


def test_every_cell_is_a_valid_single_gpu_recipe_the_planner_plans():
    from benchmarks.gpu_report import planner_prediction

    for cell in set(full_matrix()) | set(round_three_full()):
        recipe = build_recipe(cell, "H100-80GB", 79.1)
        assert find_problems(recipe) == [], cell.label
        prediction = planner_prediction(recipe)
        assert prediction.gib > 0 and prediction.verdict in ("fits", "tight", "does not fit"), cell.label
    for cell in set(round_three_full()) | set(round_three_quick()):
        recipe = build_recipe(cell, "H200", 139.81)
        assert find_problems(recipe) == []
        assert (recipe.method.kind, recipe.memory.gradient_checkpointing, recipe.training.max_seq_length,
                recipe.memory.attention, recipe.training.micro_batch_size) == (
            cell.method, cell.gradient_checkpointing, cell.seq_len, cell.attention, cell.micro_batch)
        assert recipe.world_size == 1 and recipe.model.dtype == "bfloat16"
        assert (recipe.method.quantization is not None) == (cell.method == "qlora")


@pytest.mark.parametrize("device_name, memory_gib, expected", [
    ("NVIDIA H200", 140.4, "H200"),
    ("NVIDIA H100 80GB HBM3", 79.1, "H100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
    ("NVIDIA L40S", 44.4, "L40S"),
    ("NVIDIA L4", 22.0, "L4"),
    ("NVIDIA GeForce RTX 4090", 23.6, "RTX4090"),
    ("NVIDIA B200", 178.4, None),
])
def test_device_names_map_to_the_gpu_catalog(device_name, memory_gib, expected):
    spec = catalog_gpu(device_name, memory_gib)
    assert (spec.name if spec else None) == expected


# ---- comparison and report, on recorded results ------------------------------------------------

def test_csv_round_trips_exactly():
    assert results_csv(read_results(SAMPLE)) == SAMPLE.read_text()


def test_round_four_columns_round_trip_and_a_round_three_csv_still_reads(tmp_path):
    old = read_results(ROUND_THREE_CSV)
    assert len(old) == 90 and {r.cell.tactic for r in old} == {"none"} and {r.cell.layers for r in old} == {None}
    moe = next(cell for cell in full_matrix() if cell.tactic == "lora-experts")
    measured = [dataclasses.replace(old[0], cell=moe, status="skipped: trl is not importable")]
    text = results_csv(measured)
    (tmp_path / "four.csv").write_text(text)
    assert read_results(tmp_path / "four.csv")[0].cell == moe and results_csv(read_results(tmp_path / "four.csv")) == text
    assert main(["--report", str(ROUND_THREE_CSV), "--out", str(tmp_path)]) == 0
    remade = (tmp_path / ROUND_THREE_CSV.name).read_text().splitlines()
    assert remade[0].startswith("model,method,gradient_checkpointing,seq_len,attention,micro_batch,tactic,layers,")
    assert len(remade) == 91


def test_summary_numbers_of_the_recorded_sample():
    summary = summarize(read_results(SAMPLE))
    assert (summary.cells, summary.ran, summary.oom, summary.compared) == (9, 6, 2, 6)
    # against reserved + 0.5 GiB context: |errors| 0.4 0.6 0.9 1.0 1.0 6.0 GiB; 2.353 3.846 4.390 4.428 5.714 10.256 %
    assert summary.median_abs_error_gib == pytest.approx(0.95)
    assert summary.median_abs_error_pct == pytest.approx((0.9 / 20.5 * 100 + 6 / 135.5 * 100) / 2)
    assert summary.worst_gib == ("Llama-3.1-8B full no-gc s2048 eager mb1", pytest.approx(6.0))
    assert summary.worst_pct == ("Qwen2.5-0.5B lora gc s2048 sdpa mb4", pytest.approx(0.4 / 3.9 * 100))
    assert summary.beyond_tolerance == ("Qwen2.5-0.5B lora gc s2048 sdpa mb4",)
    assert summary.predicted_fit_but_oom == ("Llama-3.1-8B full no-gc s2048 sdpa mb4",)
    assert summary.predicted_oom_but_ran == ("Llama-3.1-8B full no-gc s2048 eager mb1",)
    assert summary_text(summary, "torch 2.11") == "\n".join([
        "9 cells: 6 ran, 2 OOM, 1 not measured",
        "torch 2.11",
        "prediction vs device peak (max reserved + context) over 6 cells: median |error| 0.95 GiB (4.4%)",
        "worst in GiB: +6.00 GiB (Llama-3.1-8B full no-gc s2048 eager mb1)",
        "worst in %: +10.3% (Qwen2.5-0.5B lora gc s2048 sdpa mb4)",
        "off by more than 10%: 1: Qwen2.5-0.5B lora gc s2048 sdpa mb4",
        "predicted to fit but OOM: 1: Llama-3.1-8B full no-gc s2048 sdpa mb4",
        "predicted not to fit but ran: 1: Llama-3.1-8B full no-gc s2048 eager mb1",
    ])


def test_markdown_table_rows():
    results = read_results(SAMPLE)
    lines = results_markdown(results, "gpu_check on NVIDIA H200", "summary").splitlines()
    assert lines[:6] == ["# gpu_check on NVIDIA H200", "", "```", "summary", "```", ""]
    assert lines[6].startswith("| model | method | ckpt | seq | attn | mb | tactic | status | alloc GiB | reserved GiB |")
    rows = lines[8:]
    assert len(rows) == len(results)
    assert rows[0] == ("| Llama-3.1-8B | full | no | 2048 | eager | 1 | none | ok | 128.40 | 135.00 | 135.50 | 141.50 | +6.00 "
                       "| +4.4 | does not fit | 3346 | 16.3 |")
    assert rows[2] == "| Llama-3.1-8B | full | no | 2048 | sdpa | 4 | none | OOM |  |  |  | 120.00 |  |  | fits |  |  |"
    assert rows[4] == ("| Llama-3.1-8B | qlora | yes | 512 | sdpa | 1 | none | skipped: bitsandbytes is not installed |  |  |  "
                       "| 7.50 |  |  | fits |  |  |")
    assert rows[6] == ("| Qwen2.5-0.5B | full | no | 2048 | sdpa | 4 | none | ok | 14.20 | 15.10 | 15.60 | 15.00 | -0.60 "
                       "| -3.8 | fits | 62061 | 18.6 |")


def test_predictions_are_added_per_cell_and_a_missing_planner_is_a_note():
    measured = read_results(SAMPLE)

    def double_the_micro_batch(recipe):
        return Prediction(float(2 * recipe.training.micro_batch_size), "fits", True)

    predicted, note = add_predictions(measured, double_the_micro_batch)
    assert note is None
    assert [r.predicted_gib for r in predicted] == [2.0, 8.0, 8.0, 2.0, 2.0, 2.0, 8.0, 8.0, 8.0]
    assert [r.max_reserved_gib for r in predicted] == [r.max_reserved_gib for r in measured]

    def no_planner(recipe):
        raise ImportError("No module named 'tuner.planner'")

    unchanged, note = add_predictions(measured, no_planner)
    assert unchanged == measured
    assert note == "no predictions: the planner cannot be imported (No module named 'tuner.planner')"

    def rejects_qlora(recipe):
        if recipe.method.kind == "qlora":
            raise ValueError("no 4-bit model yet")
        return Prediction(1.0, "fits", True)

    predicted, _ = add_predictions(measured, rejects_qlora)
    assert predicted[4].predicted_verdict == "error: no 4-bit model yet" and predicted[4].predicted_gib is None
    assert predicted[3].predicted_gib == 1.0


def test_report_mode_remakes_tables_without_a_gpu(tmp_path, capsys):
    assert main(["--report", str(SAMPLE), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check_sample.csv", "gpu_check_sample.md"]
    assert capsys.readouterr().out.startswith("9 cells: 6 ran, 2 OOM, 1 not measured\n")
    markdown = (tmp_path / "gpu_check_sample.md").read_text()
    assert markdown.startswith("# gpu_check on NVIDIA H200 (139.8 GiB), from gpu_check_sample.csv\n")
    assert "\ntorch 2.11.0, transformers 5.17.0\n" in markdown  # the versions that measured it survive a re-make


def test_result_files_are_named_by_date_and_gpu_and_never_overwritten(tmp_path):
    stem = results_stem("2026-11-29", "NVIDIA H100 80GB HBM3", quick=True)
    assert stem == "gpu-check_2026-11-29_NVIDIA-H100-80GB-HBM3_quick"
    assert free_stem(tmp_path, stem) == stem
    (tmp_path / f"{stem}.csv").write_text("")
    assert free_stem(tmp_path, stem) == f"{stem}-2"


def test_results_readme_shows_the_table_the_script_writes():
    assert MARKDOWN_HEADER in (REPO / "benchmarks" / "results" / "README.md").read_text()


@pytest.mark.slow
def test_cpu_smoke_runs_round_four_code_paths_on_tiny_cells():
    """Two to three minutes on a shared 2-core machine (bf16 on the CPU, GRPO generating, DeepSpeed starting), so
    outside the fast suite.  In a process of its own, as the script runs: its cells patch library classes (the
    chunked loss, DeepSpeed's and TRL's set-up) that the tests sharing a worker would otherwise trace through."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu-smoke"], cwd=REPO, capture_output=True,
                          text=True, timeout=1200, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "cpu smoke: 11 of 11 cells ok", done.stdout[-3000:]


def test_baseline_pairs_are_compared_side_by_side_next_to_the_published_claims():
    recorded = read_results(SAMPLE)[0]
    plain, tuned = (cell for cell in full_matrix() if cell.layers is None and cell.tactic in (
        "transformers-defaults", "tuner-tactics"))
    full_plain = next(cell for cell in full_matrix() if cell.layers and cell.tactic == "transformers-defaults")
    results = [dataclasses.replace(recorded, cell=plain, tokens_per_s=4000.0, max_reserved_gib=39.5, context_gib=0.5),
               dataclasses.replace(recorded, cell=tuned, tokens_per_s=5000.0, max_reserved_gib=19.5, context_gib=0.5),
               dataclasses.replace(recorded, cell=full_plain, status="OOM")]
    lines = baseline_text(results).splitlines()
    assert lines[0] == ("baseline Llama-3.1-8B lora gc s2048 auto mb1: tuner's tactics 5000 tokens/s, 20.00 GiB; plain "
                        "transformers defaults 4000 tokens/s, 40.00 GiB: 1.25x the speed at 0.50x the memory")
    assert lines[1] == ("baseline Llama-3.1-8B-L8 full gc s2048 auto mb2: tuner's tactics absent, plain transformers OOM")
    assert lines[2].startswith("claim, not measured here: unsloth claims 2x faster") and "one 80 GB GPU" in lines[2]
    assert "8xA100 with FSDP1" in lines[3] and len(lines) == 4
    assert baseline_text(read_results(SAMPLE)) is None  # round three has no baseline cells


def test_every_round_four_shape_builds_with_its_adapters_and_the_planners_parameter_count():
    """On the meta device: the GPU run's first step for each model never dies on a config, and counts what the
    planner counts (its MFU and the plan read the same model)."""
    from benchmarks.gpu_cells import build_model
    from benchmarks.gpu_matrix import cell_params_b
    from tuner.loading.model import count_parameters, trainable_model

    shapes = {}
    for cell in full_matrix():
        if cell.method != "qlora":
            shapes.setdefault((cell.model, cell.layers, cell.method, cell.tactic), cell)
    for cell in shapes.values():
        recipe = build_recipe(cell, "H100-80GB", 79.1)
        model = build_model(cell, recipe, device="meta")
        total = sum(parameter.numel() for parameter in model.parameters())
        assert total == pytest.approx(cell_params_b(cell) * 1e9, rel=0.01), cell.label
        if cell.method == "lora":
            trainable, _ = count_parameters(trainable_model(model, recipe))
            assert 0 < trainable < total / 20, cell.label
