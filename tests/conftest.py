"""Shared fixtures: an isolated tuner home, the built demo model, and a CLI runner."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Two xdist workers share two cores: one thread per process (and per rank of the processes they launch), or
# OpenMP threads spin against each other and a training process runs ten times slower than alone.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Nothing comes from the hub (tests that use one start a local server). Set before any test module is collected:
# huggingface_hub reads it once, when first imported, and a test module may import transformers at its top.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def tuner_home(tmp_path_factory) -> Path:
    """Every test session builds its own demo model once, away from the user's cache.

    TUNER_TEST_HOME reuses a cache between sessions (the model is rebuilt if missing).
    """
    home = Path(os.environ.get("TUNER_TEST_HOME") or tmp_path_factory.getbasetemp().parent / "tuner-home")
    os.environ["TUNER_HOME"] = str(home)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return home


@pytest.fixture(scope="session")
def demo_model_path(tuner_home) -> Path:
    from tuner.loading.demo_model import builtin_model_path

    return builtin_model_path("builtin:demo")


def run_tuner(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None,
              input: str | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would: the tuner installed in this interpreter's environment
    (``make install``'s editable install of this checkout), found without a source path."""
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, input=input,
        env={**os.environ, **(env or {})},
    )


# what the libraries print of their own (loading, data and scoring bars, notices): a user's terminal shows none of it
LIBRARY_NOISE = ("Loading weights", "it/s]", "fatal: not a git", "gemm_4bit_forward", "Running generate_until",
                 "Generating train split", "Writing model shards")


def library_noise(text: str) -> list[str]:
    """The lines of ``text`` (a command's stdout or stderr; a bar's carriage returns split it too) a library wrote."""
    return [line for line in text.replace("\r", "\n").splitlines() if any(word in line for word in LIBRARY_NOISE)]


def builds_of(output: str, what: str) -> int:
    """How many processes built the cache ``what`` ("the built-in demo model"): tuner.build_once logs each build."""
    return output.count(f"building {what} in ")


@pytest.fixture
def tuner_cli():
    return run_tuner


@pytest.fixture(scope="session")
def trained_demo(tmp_path_factory) -> Path:
    """The demo recipe fine-tuned through `tuner run` for 200 steps (of its 594), holding out 2% of the words (80)
    for `tuner eval`. It then reverses most unseen words but only about a third of demo-grpo's held-out run words
    (`qbbbbb`) greedily, so GRPO has a signal to learn from (at 150 steps it got 8%, at 300 steps 95%).  Tests that
    use it share an xdist group ("trained-demo"), so one worker trains it once."""
    cwd = tmp_path_factory.mktemp("trained-demo")
    trained = run_tuner("run", "demo", "--set", "training.max_steps=200", "--set", "data.eval_fraction=0.02",
                        "--set", "training.max_seq_length=24", cwd=cwd)
    assert trained.returncode == 0, trained.stderr[-2000:]
    return cwd / "runs" / "demo"


def process_running(pid: int) -> bool:
    """Whether ``pid`` still runs (a killed rank can linger a moment as a zombie until init reaps it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_running(pids, within: float = 30.0) -> list[int]:
    """The ``pids`` still running after up to ``within`` seconds: a stopped rank exits a moment after its parent,
    later on a loaded machine, so poll instead of sleeping a fixed time."""
    deadline = time.monotonic() + within
    while (left := [pid for pid in pids if process_running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
