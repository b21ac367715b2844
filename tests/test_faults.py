"""Faults in a real run: a rank killed with SIGKILL is named with its last lines, and the run exits non-zero."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.rundir.events import read_records

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition, timeout: float, what: str, process: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if process.poll() is not None:
            pytest.fail(f"the run ended ({process.returncode}) before {what}: {process.communicate()}")
        time.sleep(0.2)
    process.kill()
    pytest.fail(f"timed out waiting for {what}")


def training_rank(process: subprocess.Popen, rank: int):
    import psutil

    for child in psutil.Process(process.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "tuner.train" in child.cmdline():
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_a_rank_killed_with_sigkill_is_reported_by_tuner_run(tmp_path, demo_model_path) -> None:
    settings = ["name=killed", "hardware.num_processes=2", "memory.distributed=ddp", f"hardware.main_process_port={free_port()}",
                "training.max_steps=400", "training.logging_steps=1", "data.max_samples=200", "data.eval_fraction=0",
                "training.micro_batch_size=4"]
    process = subprocess.Popen(
        [sys.executable, "-m", "tuner", "run", "demo", *[a for s in settings for a in ("--set", s)]],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    events = tmp_path / "runs" / "killed" / "events.jsonl"
    wait_for(lambda: any(e["event"] == "step" for e in read_records(events)), 300, "the first step", process)
    victim = wait_for(lambda: training_rank(process, 1), 30, "rank 1's process", process)
    victim.send_signal(signal.SIGKILL)
    _, err = process.communicate(timeout=180)

    assert process.returncode != 0
    assert "rank 1 (local rank 1" in err and "was killed by SIGKILL" in err, err
    assert "full log: runs/killed/train.log" in err
    assert "Traceback" not in err.split("rank 1 (local rank 1")[0]  # the report comes first, not a stack


RAISE_ON_RANK_1 = """\
import os
if os.environ.get("RANK") == "1":  # only in the rank: the tuner run that launched it stays as it is
    from tuner.train.callbacks import EventsCallback

    def bad_batch(self, args, state, control, **kwargs):
        raise ValueError("bad batch on purpose")

    EventsCallback.on_step_end = bad_batch
"""


def test_an_exception_in_a_rank_is_reported_with_its_type_and_where(tmp_path, demo_model_path) -> None:
    """Two real gloo ranks, rank 1 raising after its first step: the report is the rank's own, not the log."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(RAISE_ON_RANK_1)
    settings = ["name=raised", "hardware.num_processes=2", "memory.distributed=ddp", f"hardware.main_process_port={free_port()}",
                "training.max_steps=20", "training.logging_steps=1", "data.max_samples=64", "data.eval_fraction=0",
                "training.micro_batch_size=4"]
    result = subprocess.run(
        [sys.executable, "-m", "tuner", "run", "demo", *[a for s in settings for a in ("--set", s)]],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(inject), str(REPO)])},
    )
    assert result.returncode != 0
    assert "rank 1 failed: ValueError: bad batch on purpose (raised at " in result.stderr, result.stderr
    assert "sitecustomize.py:" in result.stderr.split("raised at ")[1].split(")")[0]


SMALL = ["data.max_samples=64", "data.eval_fraction=0", "training.micro_batch_size=8", "training.warmup_steps=0",
         "training.logging_steps=1", "training.save_steps=2", "training.resume=auto"]


def test_a_truncated_checkpoint_is_skipped_on_resume_with_a_message(tmp_path, capsys, demo_model_path) -> None:
    """Train 4 steps (checkpoints 2 and 4), cut checkpoint-4's weights in half, resume to step 6."""
    from tuner.launch.run import prepare_run
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_path
    from tuner.render.run_directory import write_run_directory
    from tuner.train.__main__ import main as train_main

    run_dir = tmp_path / "run"
    first = load_recipe(builtin_path("demo"), [*SMALL, "training.max_steps=4"])
    write_run_directory(first, run_dir)
    assert train_main([str(run_dir / "recipe.lock.yaml")]) == 0
    weights = run_dir / "checkpoints" / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    prepared = prepare_run(load_recipe(builtin_path("demo"), [*SMALL, "training.max_steps=6"]), output_dir=run_dir)
    prepared.release()
    data, *told = prepared.notes
    assert data.startswith("data: ") and "samples to train on" in data
    assert told[0].startswith(f"skipping {run_dir / 'checkpoints' / 'checkpoint-4'}: model.safetensors: truncated (")
    assert told[1] == f"resuming from {run_dir / 'checkpoints' / 'checkpoint-2'}"
    assert train_main([str(run_dir / "recipe.lock.yaml")]) == 0
    started = [e for e in read_records(run_dir / "events.jsonl") if e["event"] == "started"][-1]
    assert started["resumed_from_step"] == 2
    assert read_records(run_dir / "events.jsonl")[-1]["event"] == "finished"


def test_out_of_memory_mid_run_is_answered_with_the_next_rung(tmp_path, capsys, monkeypatch, demo_model_path) -> None:
    """torch.OutOfMemoryError raised from a callback after the first step, as a GPU would mid-run."""
    import torch

    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_path
    from tuner.render.run_directory import write_run_directory
    from tuner.train.__main__ import main as train_main
    from tuner.train.callbacks import EventsCallback

    def out_of_memory(self, args, state, control, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(EventsCallback, "on_step_end", out_of_memory)
    run_dir = write_run_directory(load_recipe(builtin_path("demo"), [*SMALL, "training.max_steps=4"]), tmp_path / "run")
    lock = run_dir / "recipe.lock.yaml"
    assert train_main([str(lock)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "error: out of GPU memory. Next step on the memory ladder (chunked_loss): the chunked loss" in err
    assert f"tuner run {lock} --set memory.chunked_loss=true --resume" in err
    error = read_records(run_dir / "events.jsonl")[-1]
    assert (error["event"], error["kind"], error["next_rung"]) == ("error", "out_of_memory", "chunked_loss")


def test_run_refuses_an_output_disk_too_small_for_its_checkpoints(tmp_path, monkeypatch, capsys) -> None:
    """8B full fine-tuning keeps three checkpoints of weights and Adam states: ~350 GiB."""
    import shutil

    from tuner.cli import main

    monkeypatch.chdir(tmp_path)
    gpu_run = ["--set", "model.id=meta-llama/Llama-3.1-8B", "--set", "hardware.gpus_per_machine=8", "--set",
               "hardware.gpu=H100-80GB", "--set", "memory.distributed=deepspeed", "--set", "memory.zero_stage=3",
               "--set", "memory.mixed_precision=bf16", "--set", "model.dtype=bfloat16", "--set", "training.save_total_limit=2"]
    code = main(["run", "demo", *gpu_run, "--dry-run"])
    err = capsys.readouterr().err
    if shutil.disk_usage(tmp_path).free / 2**30 > 400:
        pytest.skip("this disk has room for the checkpoints")
    assert code == 2 and err.startswith("error: output.dir: output runs/demo: ") and "checkpoints need ~" in err
    assert "--force" in err and not (tmp_path / "runs").exists()
    assert main(["run", "demo", *gpu_run, "--dry-run", "--force"]) == 0
    assert "launching anyway: output.dir: output runs/demo:" in capsys.readouterr().err


def test_ranks_stop_without_saving_when_tuner_run_is_killed(tmp_path, demo_model_path) -> None:
    """SIGKILL of `tuner run` (nothing can be caught): its ranks, under accelerate launch and torchrun, see their
    supervisor gone and stop; no checkpoint is completed after the kill, so none was written by nobody's command.
    The run is quiet (no progress bars, no log lines): a rank that prints dies of the dead tuner's broken pipe
    anyway, a quiet one trained on."""
    import psutil

    from tuner.rundir.checkpoints import checkpoint_states

    settings = ["name=orphan", "hardware.num_processes=2", "memory.distributed=ddp",
                f"hardware.main_process_port={free_port()}", "training.max_steps=100000", "training.logging_steps=100000",
                "training.save_steps=1", "training.save_total_limit=1000", "data.max_samples=64",
                "data.eval_fraction=0", "training.micro_batch_size=4"]
    process = subprocess.Popen(
        [sys.executable, "-m", "tuner", "run", "demo", *[a for s in settings for a in ("--set", s)]],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    run_dir = tmp_path / "runs" / "orphan"
    complete = lambda: {path.name for path, problem in checkpoint_states(run_dir / "checkpoints") if problem is None}  # noqa: E731
    wait_for(complete, 300, "the first complete checkpoint", process)
    ranks = [wait_for(lambda rank=rank: training_rank(process, rank), 30, f"rank {rank}", process) for rank in (0, 1)]
    everything = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = complete()
    gone, alive = psutil.wait_procs(everything, timeout=60)
    for leftover in alive:
        leftover.kill()
    assert not alive, f"still running after their tuner run died: {[p.cmdline() for p in alive]}"
    assert all(rank in gone for rank in ranks)
    assert len(complete() - before) <= 1, "only a checkpoint whose save began before the kill may complete"
