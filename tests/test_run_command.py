"""``tuner run``: dry run, refusals (existing directory, multi-node, plan that does not fit) and Ctrl-C."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, still_running
from tuner.rundir.events import read_records

pytestmark = pytest.mark.slow  # runs tuner run in real processes


def sets(*settings: str) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def test_dry_run_writes_and_prints_the_files_and_command_and_runs_nothing(tmp_path, tuner_cli):
    result = tuner_cli("run", "demo", "--dry-run", *sets("name=dry", "hardware.num_processes=2",
                                                           "memory.distributed=deepspeed", "memory.zero_stage=2"),
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "runs" / "dry"
    assert sorted(p.name for p in run_dir.iterdir()) == ["accelerate.yaml", "deepspeed.json", "launch.sh", "recipe.lock.yaml",
                                                          "tuner_files.json"]  # the manifest, written last
    for name in ("accelerate.yaml", "deepspeed.json", "launch.sh"):
        assert f"==> runs/dry/{name} <==" in result.stdout
    assert result.stdout.rstrip().endswith(
        "accelerate launch --config_file runs/dry/accelerate.yaml --log_dir runs/dry/elastic -m tuner.train "
        "runs/dry/recipe.lock.yaml")
    assert not (run_dir / "train.log").exists() and not (run_dir / "events.jsonl").exists()

    # what a dry run left (no run started there) is replaced without --force, stale files included
    again = tuner_cli("run", "demo", "--dry-run", *sets("name=dry"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert not (run_dir / "deepspeed.json").exists()  # no longer a DeepSpeed run: no stale config left behind

    (run_dir / "events.jsonl").write_text("")  # a run has started there: its folder is replaced only when forced
    refused = tuner_cli("run", "demo", "--dry-run", *sets("name=dry"), cwd=tmp_path)
    assert refused.returncode == 2 and "--force" in refused.stderr
    forced = tuner_cli("run", "demo", "--dry-run", "--force", *sets("name=dry"), cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (run_dir / "events.jsonl").exists()  # --force replaces the rendered files and keeps what the run wrote

    (run_dir / "notes.txt").write_text("mine")  # a file tuner did not write: no override replaces that folder
    foreign = tuner_cli("run", "demo", "--dry-run", "--force", *sets("name=dry"), cwd=tmp_path)
    assert foreign.returncode == 2 and "notes.txt" in foreign.stderr
    assert (run_dir / "notes.txt").read_text() == "mine"


def test_multi_node_run_says_what_to_start_on_each_machine(tmp_path, tuner_cli):
    result = tuner_cli("run", "demo", *sets("name=nodes", "hardware.machines=2", "hardware.gpus_per_machine=4",
                                            "hardware.gpu=A100-80GB", "hardware.main_process_ip=10.1.2.3",
                                            "memory.distributed=ddp", "memory.mixed_precision=bf16"), cwd=tmp_path)
    assert result.returncode == 2
    assert "runs/nodes/launch.sh N" in result.stderr and "sbatch runs/nodes/slurm.sbatch" in result.stderr
    assert ("machine 1: accelerate launch --config_file runs/nodes/accelerate.yaml --log_dir runs/nodes/elastic "
            "--machine_rank 1") in result.stderr


def test_a_plan_that_does_not_fit_is_refused_unless_forced(tmp_path, tuner_cli):
    tiny_gpu = sets("name=oom", "hardware.gpus_per_machine=1", "hardware.gpu_memory_gb=0.01",
                    "memory.mixed_precision=bf16", "model.dtype=bfloat16")
    refused = tuner_cli("run", "demo", "--dry-run", *tiny_gpu, cwd=tmp_path)
    assert refused.returncode == 2
    assert "GiB missing" in refused.stderr and "--force" in refused.stderr
    assert not (tmp_path / "runs" / "oom").exists()
    forced = tuner_cli("run", "demo", "--dry-run", "--force", *tiny_gpu, cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr


def test_ctrl_c_stops_every_rank_and_names_the_last_checkpoint(tmp_path, demo_model_path):
    command = [sys.executable, "-m", "tuner", "run", "demo", *sets(
        "name=stop", "hardware.num_processes=2", "memory.distributed=ddp", "training.max_steps=100000",
        "training.save_steps=2", "training.logging_steps=1", "data.max_samples=400", "data.eval_fraction=0",
        "training.micro_batch_size=2")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_TRACE_RANKS": "1"}
    tuner = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events_file = tmp_path / "runs" / "stop" / "events.jsonl"
    deadline = time.monotonic() + 240
    while not any(e["event"] == "checkpoint" for e in read_records(events_file)):
        assert tuner.poll() is None, tuner.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.5)
    rank_pids = [e["pid"] for e in read_records(events_file) if e["event"] == "rank_batch"]
    assert len(rank_pids) == 2

    tuner.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends to the foreground process
    out, err = tuner.communicate(timeout=120)
    assert tuner.returncode != 0
    assert "stopping every rank" in err
    assert "last complete checkpoint: runs/stop/checkpoints/checkpoint-" in err, err
    assert "--resume" in err
    assert not still_running(rank_pids), "a rank outlived Ctrl-C"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_ignored_or_blocked_by_the_parent_still_stops_a_followed_run(signum):
    """A tuner started with the stop signals ignored and blocked (a background job of a non-interactive shell, a
    test runner's worker) still turns SIGINT/SIGTERM into a stop while it follows its ranks."""
    script = ("import os, sys, time\n"
              "from tuner.launch.run import RunInterrupted, signals_stop_the_run\n"
              "try:\n"
              "    with signals_stop_the_run():\n"
              f"        os.kill(os.getpid(), {int(signum)})\n"
              "        time.sleep(5)\n"
              "except (KeyboardInterrupt, RunInterrupted):\n"
              "    sys.exit(3)\n")

    def ignore_and_block():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT, signal.SIGTERM])

    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)},
                          preexec_fn=ignore_and_block, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
