"""The MoE demo's per-rank memory on two gloo ranks against the plan: ZeRO-2 and ZeRO-3, full and LoRA on experts.

    python -m benchmarks.moe_rank_traces [ENGINE:PRECISION ...]   # default: every run of RUNS

Builds ``builtin:demo-moe`` (a tiny Qwen3-MoE, 8 experts, top-2) once under $TUNER_HOME, then runs
tests/rank_memory.py under torchrun on two gloo ranks: per rank, a warm-up step and one traced step of DeepSpeed
(bf16 engine, fp32 master partitions, the Trainer's torch AdamW) under torch's MemTracker; the ``-lora`` runs first
wrap the model with the LoRA of the built-in recipe demo-moe-lora (attention and the fused experts through PEFT's
``target_parameters``). Prints, per run and rank, the plan's tensors alive between steps and its step peak (the plan of
the same configuration, per rank) against the traced ones; the table is in docs/memory.md ("The MoE demo on two
ranks"). tests/test_demo_moe.py runs one of these runs.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "rank_memory.py"
RANKS = 2
RUNS = ("zero2:bf16", "zero3:bf16", "zero2-lora:bf16", "zero3-lora:bf16")
MODEL_ID = "builtin:demo-moe"


@dataclass(frozen=True)
class RankTrace:
    """One rank's traced step of one run beside the plan's per-rank figures (bytes)."""

    run: str
    rank: int
    planned_states: float
    traced_states: int
    planned_peak: float
    traced_peak: int

    @property
    def states_error(self) -> float:
        return self.planned_states / self.traced_states - 1

    @property
    def peak_error(self) -> float:
        return self.planned_peak / self.traced_peak - 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def planned(model_dir: Path, run: str, ranks: int = RANKS) -> tuple[float, float]:
    """(bytes alive between steps, peak bytes of the step) per rank, as the plan of the traced run says."""
    sys.path.insert(0, str(WORKER.parent))
    from rank_memory import traced_recipe

    from tuner.planner import plan
    from tuner.planner.items import ALWAYS, TRAINING_STEP

    device = plan(traced_recipe(model_dir, run, ranks)).devices[0]  # a CPU recipe's device holds every process
    between_steps = sum(i.bytes for i in device.items if i.phase == ALWAYS and i.level == "allocated"
                        and i.category in ("weights", "lora_adapter", "gradients", "optimizer"))
    return between_steps / ranks, device.phase_gib(TRAINING_STEP, ("allocated",)) * 2**30 / ranks


def trace_ranks(runs=RUNS, ranks: int = RANKS, out_dir: Path | None = None) -> list[RankTrace]:
    """Run ``runs`` on ``ranks`` gloo ranks (one torchrun) and hold each rank's trace beside the plan."""
    from tuner.loading.demo_model import builtin_model_path

    model_dir = builtin_model_path(MODEL_ID)
    with tempfile.TemporaryDirectory(prefix="moe-ranks-") as scratch:
        out = Path(out_dir or scratch)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
                               f"--master_port={_free_port()}", str(WORKER), str(out), str(model_dir), *runs],
                              capture_output=True, text=True, timeout=900, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"the ranks failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        per_rank = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(ranks)]
    traces = []
    for run in runs:
        states, peak = planned(model_dir, run, ranks)
        for rank, traced in enumerate(per_rank):
            traces.append(RankTrace(run, rank, states, traced[run]["persistent"]["Total"], peak,
                                    traced[run]["peak"]["Total"]))
    return traces


def table(traces: list[RankTrace]) -> str:
    mib = 2**20
    lines = ["| run | rank | between steps: plan / trace | step peak: plan / trace |", "|---|---:|---|---|"]
    for t in traces:
        lines.append(f"| {t.run} | {t.rank} | {t.planned_states / mib:.2f} / {t.traced_states / mib:.2f} MiB "
                     f"({t.states_error:+.1%}) | {t.planned_peak / mib:.2f} / {t.traced_peak / mib:.2f} MiB "
                     f"({t.peak_error:+.1%}) |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    print(table(trace_ranks(tuple(argv) or RUNS)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
