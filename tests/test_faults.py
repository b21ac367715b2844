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

from tuner.events import read_events

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
                "memory.micro_batch_size=4"]
    process = subprocess.Popen(
        [sys.executable, "-m", "tuner", "run", "demo", *[a for s in settings for a in ("--set", s)]],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    events = tmp_path / "runs" / "killed" / "events.jsonl"
    wait_for(lambda: any(e["event"] == "step" for e in read_events(events)), 300, "the first step", process)
    victim = wait_for(lambda: training_rank(process, 1), 30, "rank 1's process", process)
    victim.send_signal(signal.SIGKILL)
    _, err = process.communicate(timeout=180)

    assert process.returncode != 0
    assert "rank 1 (local rank 1" in err and "was killed by SIGKILL" in err, err
    assert "full log: runs/killed/train.log" in err
    assert "Traceback" not in err.split("rank 1 (local rank 1")[0]  # the report comes first, not a stack
