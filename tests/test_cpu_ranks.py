"""Real two-rank training on the CPU (gloo) through ``tuner run``: DDP, ZeRO-2 and ZeRO-3 (each on a cold home of its
own: nothing is built before the ranks ask for it), ZeRO-2 with CPU Adam offload.

Each run shows data parallelism, not two copies of one run: world size 2, the ranks' first batches hold
different samples, the loss falls, both ranks end with the same weights, and the saved model (ZeRO-3:
gathered from the shards) loads with from_pretrained and equals them.
"""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from conftest import builds_of
from tuner.rundir.events import read_records

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ranks")]  # one multi-rank run at a time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_rank_overrides(name: str, *extra: str) -> list[str]:
    settings = [
        f"name={name}", "hardware.num_processes=2", f"hardware.main_process_port={free_port()}",
        "training.max_steps=6", "training.warmup_steps=0", "training.logging_steps=1",
        "data.max_samples=120", "data.eval_fraction=0", "training.micro_batch_size=4", *extra,
    ]
    return [arg for setting in settings for arg in ("--set", setting)]


def parameters_checksum_of(path: Path) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    return sum(float(p.detach().double().sum()) for p in model.parameters())


@pytest.mark.parametrize("name, tactic", [
    ("ddp", ["memory.distributed=ddp"]),
    ("zero2", ["memory.distributed=deepspeed", "memory.zero_stage=2"]),
    ("zero3", ["memory.distributed=deepspeed", "memory.zero_stage=3"]),
])
def test_two_ranks_train_on_different_samples_and_agree(name, tactic, tmp_path, tuner_cli):
    """On a cold home of its own: one rank builds the demo model and the prepared dataset, the other waits for them."""
    extensions, home = tmp_path / "torch_extensions", tmp_path / "home"
    result = tuner_cli("run", "demo", *two_rank_overrides(name, *tactic), cwd=tmp_path, timeout=300,
                       env={"TUNER_TRACE_RANKS": "1", "TORCH_EXTENSIONS_DIR": str(extensions), "TUNER_HOME": str(home)})
    run_dir = tmp_path / "runs" / name
    assert result.returncode == 0, result.stdout + result.stderr + (run_dir / "train.log").read_text()[-3000:]
    ranks_log = (run_dir / "train.log").read_text()
    assert builds_of(ranks_log, "the built-in demo model") == 1 and builds_of(ranks_log, "the prepared dataset") == 1
    check_data_parallel_run(run_dir, home / "models" / "demo")
    # DeepSpeed's CPU ranks talk through gloo: no C++ op compiled at start-up (minutes, behind a lock a stop leaves)
    assert not extensions.exists() or not any(extensions.iterdir()), sorted(extensions.rglob("*"))


def check_data_parallel_run(run_dir: Path, initial_model: Path) -> None:
    events = read_records(run_dir / "events.jsonl")
    started = next(e for e in events if e["event"] == "started")
    assert started["world_size"] == 2

    batches = {e["rank"]: set(e["samples"]) for e in events if e["event"] == "rank_batch"}
    assert sorted(batches) == [0, 1]
    assert not batches[0] & batches[1], "both ranks trained on the same samples: not data parallel"

    losses = [e["loss"] for e in events if e["event"] == "step" and "loss" in e]
    assert len(losses) >= 5 and losses[-1] < losses[0]

    finished = {e["rank"]: e["parameters_checksum"] for e in events if e["event"] == "rank_finished"}
    assert sorted(finished) == [0, 1] and finished[0] == finished[1], finished
    saved = parameters_checksum_of(run_dir / "final")
    assert saved == pytest.approx(finished[0], rel=1e-9, abs=1e-6)
    assert saved != pytest.approx(parameters_checksum_of(initial_model), rel=1e-9, abs=1e-6)  # it trained


def cpu_adam_missing() -> str | None:
    """None when DeepSpeed's CPU Adam is built here, else why the test cannot run.

    Building it (a JIT C++ compile, minutes on two cores) is a setup step, not part of a test.
    """
    from deepspeed.ops.op_builder import CPUAdamBuilder
    from torch.utils.cpp_extension import _get_build_directory

    builder = CPUAdamBuilder()
    if not builder.is_compatible(verbose=False):
        return "DeepSpeed's CPU Adam is not compatible with this machine"
    if not (Path(_get_build_directory(builder.name, verbose=False)) / f"{builder.name}.so").exists():
        return ("DeepSpeed's CPU Adam is not built here; build it once with "
                "python -c 'from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()'")
    return None


def test_zero2_with_optimizer_offloaded_to_cpu(tmp_path, tuner_cli, demo_model_path):
    why_not = cpu_adam_missing()
    if why_not:
        pytest.skip(why_not)
    result = tuner_cli("run", "demo", *two_rank_overrides(
        "zero2_offload", "memory.distributed=deepspeed", "memory.zero_stage=2", "memory.offload_optimizer=cpu"),
        cwd=tmp_path, env={"TUNER_TRACE_RANKS": "1"}, timeout=300)
    run_dir = tmp_path / "runs" / "zero2_offload"
    assert result.returncode == 0, result.stdout + result.stderr + (run_dir / "train.log").read_text()[-3000:]
    check_data_parallel_run(run_dir, demo_model_path)
    optimizers = {e["optimizer"] for e in read_records(run_dir / "events.jsonl") if e["event"] == "rank_finished"}
    assert optimizers == {"DeepSpeedCPUAdam"}
