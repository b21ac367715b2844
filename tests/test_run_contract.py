"""The one run contract (tuner/launch/run.py): every check before anything is written, one lock per run directory,
a summary at the end, and no rank that outlives a signal."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, still_running

from tuner.launch.run import RunRefused, prepare_run
from tuner.recipe.io import load_recipe, recipe_to_yaml
from tuner.recipe.registry import builtin_path
from tuner.recipe.source import RecipeError
from tuner.rundir.events import Eval, Finished, Step, read_records, write_event
from tuner.rundir.lock import RunLock, lock_path
from tuner.rundir.summary import summarize_run

FAST = ["data.max_samples=64", "data.eval_fraction=0", "training.micro_batch_size=8", "training.warmup_steps=0"]


def demo(tmp_path, *overrides: str):
    return load_recipe(builtin_path("demo"), [*FAST, f"output.dir={tmp_path / 'run'}", *overrides])


def test_a_run_is_planned_once_for_its_memory_and_its_disk(tmp_path, monkeypatch):
    import tuner.planner

    plans = []
    real_plan = tuner.planner.plan

    def counted_plan(*args, **kwargs):
        plans.append(args)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(tuner.planner, "plan", counted_plan)
    prepared = prepare_run(demo(tmp_path), dry_run=True)
    assert len(plans) == 1, "the disk check sizes the checkpoints from the plan the memory check made"
    assert prepared.run_dir.is_dir()


def test_a_plan_that_does_not_fit_is_refused_before_anything_is_written(tmp_path):
    recipe = demo(tmp_path, "hardware.gpus_per_machine=1", "hardware.gpu_memory_gb=0.01",
                  "memory.mixed_precision=bf16", "model.dtype=bfloat16")
    with pytest.raises(RunRefused) as refused:
        prepare_run(recipe)
    assert "GiB missing" in str(refused.value)
    assert not (tmp_path / "run").exists() and not lock_path(tmp_path / "run").exists()
    prepared = prepare_run(recipe, force=True, dry_run=True)
    assert any(note.startswith("launching anyway: predicted not to fit") for note in prepared.notes)
    assert not lock_path(tmp_path / "run").exists(), "a dry run holds no lock"


def test_bad_data_is_refused_before_the_run_directory_exists(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "fine"}\n{"prompt": "no text column"}\n')
    with pytest.raises(Exception) as failed:
        prepare_run(demo(tmp_path, f"data.source={data}", "data.format=text"))
    assert type(failed.value).__name__ == "DataError" and f"{data}:2:" in str(failed.value)
    assert not (tmp_path / "run").exists()


def test_an_unknown_model_is_one_message_not_a_traceback(tmp_path, tuner_cli):
    result = tuner_cli("run", "demo", "--dry-run", "--set", "model.id=foo/bar", "--set", f"output.dir={tmp_path / 'r'}",
                       cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: model.id: foo/bar") and "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()


def test_a_second_tuner_on_the_same_run_directory_is_refused_naming_the_first(tmp_path):
    first = prepare_run(demo(tmp_path))
    try:
        holder = json.loads(lock_path(first.run_dir).read_text())
        assert holder["pid"] == os.getpid()
        # another process holding it: simulate by writing a live foreign PID (this test's parent) with its start time
        import psutil

        parent = psutil.Process(os.getppid())
        lock_path(first.run_dir).write_text(json.dumps({"pid": parent.pid, "host": holder["host"],
                                                        "started": parent.create_time()}))
        with pytest.raises(RecipeError) as refused:
            prepare_run(demo(tmp_path), resume=True)
        assert f"another tuner (pid {parent.pid}) is using this run directory" in str(refused.value)
    finally:
        lock_path(first.run_dir).unlink(missing_ok=True)


def test_a_stale_lock_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock_path(run_dir).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "started": 1.0}))
    with RunLock(run_dir) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert not lock.path.exists()


def test_a_refused_resume_leaves_the_run_directory_as_it_was(tmp_path):
    """Resume compatibility is checked before the lock recipe is rewritten (the refusal used to come after launch)."""
    from tuner.rundir.checkpoints import resume_settings

    full = demo(tmp_path)
    prepared = prepare_run(full, dry_run=True)
    checkpoint = prepared.run_dir / "checkpoints" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    for name, text in {"trainer_state.json": json.dumps({"global_step": 2}), "model.safetensors": "", "recipe.lock.yaml": recipe_to_yaml(full),
                       "tuner_checkpoint.json": json.dumps({"step": 2, "settings": resume_settings(full, 1)})}.items():
        (checkpoint / name).write_text(text)
    (checkpoint / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    lock_before = (prepared.run_dir / "recipe.lock.yaml").read_text()

    with pytest.raises(RecipeError) as refused:
        prepare_run(demo(tmp_path, "method.kind=lora"), resume=True)
    assert "method.kind: saved with 'full', the recipe now has 'lora'" in str(refused.value)
    assert (prepared.run_dir / "recipe.lock.yaml").read_text() == lock_before
    assert not lock_path(prepared.run_dir).exists()

    resumed = prepare_run(full, resume=True)
    resumed.release()
    assert resumed.notes[-1] == f"resuming from {checkpoint}"


def test_the_summary_says_where_the_model_is_the_losses_memory_speed_and_what_next(tmp_path):
    run_dir = tmp_path / "my run"
    final = run_dir / "final"
    final.mkdir(parents=True)
    (final / "adapter_config.json").write_text("{}")
    events = run_dir / "events.jsonl"
    write_event(events, Step(step=1, extra={"loss": 4.5, "tokens_per_s": 900.0}))
    write_event(events, Step(step=10, extra={"loss": 2.25, "tokens_per_s": 1234.5}))
    write_event(events, Eval(step=10, extra={"eval_loss": 2.5}))
    write_event(events, Finished(step=10, final_dir=str(final), truncated=3, extra={"train_runtime": 12.0}))
    (run_dir / "memory.json").write_text(json.dumps({"line": "plan predicted 1.00 GiB of CPU RAM, measured 0.60 GiB"}))

    assert summarize_run(run_dir).lines() == [
        f"finished in 12 s: 10 steps; adapter saved in {final}",
        "  train loss 4.5000 -> 2.2500, held-out loss 2.5000, 1,234 tokens/s",
        "  memory: plan predicted 1.00 GiB of CPU RAM, measured 0.60 GiB",
        "  note: 3 training samples were cut to training.max_seq_length",
        "next:",
        f"  tuner infer '{run_dir}' --prompt \"...\"",
        f"  tuner chat '{run_dir}'",
        f"  tuner merge '{run_dir}'",
        f"  tuner eval '{run_dir}' --baseline",
        f"  tuner export '{run_dir}' --format ollama",
    ]
    assert summarize_run(run_dir, since=time.time() + 60) is None, "events of an earlier run are not this run's"
    (run_dir / "eval").mkdir()
    evaluated = {"models": [{"label": "base", "scores": {"held_out": {"exact_match": 0.0}}},
                            {"label": "fine-tuned", "scores": {"held_out": {"exact_match": 0.9}}}]}
    (run_dir / "eval" / "eval-20260101-000000.json").write_text(json.dumps({"time": 0, **evaluated}))
    assert not any(line.startswith("  eval:") for line in summarize_run(run_dir).lines()), "of an earlier training"
    (run_dir / "eval" / "eval-20260101-000000.json").write_text(json.dumps({"time": time.time(), **evaluated}))
    assert "  eval: held_out exact_match 0 -> 0.9 (base -> fine-tuned; eval/eval-20260101-000000.json)" in \
        summarize_run(run_dir).lines()


def _training_pids(events_file) -> list[int]:
    return [e["pid"] for e in read_records(events_file) if e["event"] == "rank_batch"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_tuner_stops_every_rank(sig, tmp_path, demo_model_path):
    """`timeout` sends SIGTERM and a closed terminal SIGHUP: the ranks run in their own session, so tuner stops them."""
    command = [sys.executable, "-m", "tuner", "run", "demo", "--set", "name=sig", "--set", "hardware.num_processes=2",
               "--set", "memory.distributed=ddp", "--set", "training.max_steps=100000", "--set", "training.logging_steps=1",
               "--set", "data.max_samples=400", "--set", "data.eval_fraction=0"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_TRACE_RANKS": "1"}
    tuner = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = tmp_path / "runs" / "sig" / "events.jsonl"
    deadline = time.monotonic() + 240
    while len(set(_training_pids(events))) < 2:
        assert tuner.poll() is None, tuner.communicate()
        assert time.monotonic() < deadline, "the ranks did not start within 240 s"
        time.sleep(0.5)
    ranks = sorted(set(_training_pids(events)))
    tuner.send_signal(sig)
    _, err = tuner.communicate(timeout=120)
    assert tuner.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err and "Start again with: tuner run runs/sig/recipe.lock.yaml" in err
    assert not still_running(ranks), "a rank outlived the signal"
    assert not lock_path(tmp_path / "runs" / "sig").exists(), "the lock is released"
