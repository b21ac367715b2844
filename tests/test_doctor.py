"""``tuner doctor``: one line per check with a fix; non-zero exit only when the recipe needs what is missing.

These run the real checks on this machine (no GPU in CI), so GPU checks must warn, not fail, for CPU recipes.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from tuner.cli import main
from tuner.check import Check
from tuner.doctor import CHECKS, check_accelerate_config, check_disk, check_gpus, run_checks
from tuner.recipe.io import validate_recipe

NO_GPU = not torch.cuda.is_available()
GPU_RECIPE = ["--set", "hardware.gpus_per_machine=1", "--set", "hardware.gpu=A100-80GB"]


def doctor(*args: str, capsys) -> tuple[int, list[str]]:
    code = main(["doctor", *args])
    out = capsys.readouterr().out
    return code, [line for line in out.splitlines() if line.strip()]


def by_name(lines: list[str]) -> dict[str, str]:
    return {line.split()[1]: line for line in lines if line.split()[0] in ("ok", "warn", "FAIL")}


def test_every_check_prints_one_line_and_a_cpu_machine_passes(capsys) -> None:
    code, lines = doctor(capsys=capsys)
    checks = by_name(lines)
    assert len(checks) == len(CHECKS)
    assert {"torch", "gpus", "bf16", "bitsandbytes", "flash-attn", "liger-kernel", "deepspeed", "nccl",
            "accelerate", "model", "disk", "shared", "host"} <= set(checks)
    assert code == 0 and lines[-1] == "all required checks passed"
    for line in lines[:-1]:
        status = line.split()[0]
        assert status in ("ok", "warn") and (status == "ok" or "  -> " in line), line  # every warning says what to do
    if NO_GPU:
        assert checks["gpus"].startswith("warn") and "no CUDA GPU" in checks["gpus"]


def test_cpu_recipe_passes(capsys) -> None:
    code, lines = doctor("demo", capsys=capsys)
    assert code == 0, lines
    assert lines[-1] == "all required checks passed for demo"


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without a CUDA GPU")
def test_gpu_recipe_fails_without_a_gpu(capsys) -> None:
    code, lines = doctor("demo", *GPU_RECIPE, "--set", "memory.mixed_precision=bf16", "--set", "model.dtype=bfloat16",
                         capsys=capsys)
    checks = by_name(lines)
    assert code == 1
    assert checks["gpus"].startswith("FAIL") and "no CUDA GPU" in checks["gpus"] and "  -> " in checks["gpus"]
    assert lines[-1].startswith("1 check(s) failed for demo:" if torch.version.cuda else "2 check(s) failed for demo:")
    assert "gpus" in lines[-1]


def test_a_missing_extension_fails_only_when_the_recipe_asks_for_it(capsys) -> None:
    try:
        import liger_kernel  # noqa: F401
        pytest.skip("liger-kernel is installed here")
    except ImportError:
        pass
    assert by_name(doctor(capsys=capsys)[1])["liger-kernel"].startswith("warn")
    code, lines = doctor("demo", "--set", "memory.liger=true", capsys=capsys)
    assert code == 1
    assert by_name(lines)["liger-kernel"].startswith("FAIL") and "memory.liger: false" in by_name(lines)["liger-kernel"]
    assert lines[-1] == "1 check(s) failed for demo: liger-kernel"


def test_leftover_accelerate_config_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    for name in [n for n in os.environ if n.startswith("ACCELERATE_")]:
        monkeypatch.delenv(name)
    assert check_accelerate_config(None).status == "ok"
    leftover = tmp_path / "accelerate" / "default_config.yaml"
    leftover.parent.mkdir()
    leftover.write_text("distributed_type: MULTI_GPU\nnum_processes: 8\n")
    result = check_accelerate_config(None)
    assert result.status == "warn" and str(leftover) in result.detail and f"rm {leftover}" in result.fix
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert "ACCELERATE_MIXED_PRECISION" in check_accelerate_config(None).detail


def test_disk_check_names_an_unwritable_output_directory() -> None:
    # /proc refuses new files even to root, unlike a chmod-ed directory
    recipe = validate_recipe({"output": {"dir": "/proc/tuner-doctor-test/run"}})
    result = check_disk(recipe)
    assert result.status == "fail" and "/proc/tuner-doctor-test/run" in result.detail and "writable" in result.fix


def test_doctor_exits_non_zero_for_an_unwritable_output_directory(capsys) -> None:
    code, lines = doctor("demo", "--set", "output.dir=/proc/tuner-doctor-test/run", capsys=capsys)
    assert code == 1 and by_name(lines)["disk"].startswith("FAIL")


def test_a_crashing_check_is_a_failed_line_not_a_traceback() -> None:
    def check_broken(recipe):
        raise RuntimeError("driver exploded\nwith details")

    (result,) = run_checks(None, checks=(check_broken,))
    assert result == Check("broken", "fail", "the check itself failed: RuntimeError: driver exploded with details",
                           "report this with the output of `tuner doctor`")


def test_json_output_is_one_object_per_check(capsys) -> None:
    assert main(["doctor", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in records][:2] == ["torch", "gpus"]
    assert all(set(r) == {"name", "status", "detail", "fix"} for r in records)


@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU")
def test_gpu_machine_reports_its_gpus() -> None:
    result = check_gpus(validate_recipe({"hardware": {"gpus_per_machine": 1, "gpu": "24GB"}}))
    assert result.status == "ok" and "GiB" in result.detail


def test_host_ram_is_checked_against_the_plans_offload() -> None:
    import psutil

    from tuner.doctor import check_host_ram
    from tuner.planner import plan

    offloaded = validate_recipe({
        "model": {"id": "meta-llama/Llama-3.1-70B"},
        "hardware": {"gpus_per_machine": 8, "gpu": "A100-80GB"},
        "memory": {"distributed": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"},
    })
    needed = plan(offloaded).host_ram_gib
    result = check_host_ram(offloaded)
    if needed > psutil.virtual_memory().total / 2**30:
        assert result.status == "fail" and f"the plan needs {needed:.0f} GiB" in result.detail and "offload" in result.fix
    assert check_host_ram(validate_recipe({})).status == "ok"


def test_disk_is_checked_against_the_checkpoints_the_run_will_write(tmp_path) -> None:
    small = check_disk(validate_recipe({"output": {"dir": str(tmp_path / "run")}}))
    assert small.status == "ok" and "checkpoints need ~" in small.detail
    huge = check_disk(validate_recipe({"model": {"id": "meta-llama/Llama-3.1-405B"}, "output": {"dir": str(tmp_path / "run")},
                                       "training": {"save_total_limit": 3}}))
    assert huge.status == "fail" and "checkpoints need ~" in huge.detail and "save_total_limit" in huge.fix
