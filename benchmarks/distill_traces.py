"""The distill plan against a fake-tensor trace of GKD's training step, on two diagnostic shapes.

``python benchmarks/distill_traces.py`` plans and traces (``tuner.loading.simulate``: the student's and the frozen
teacher's forward, TRL's ``GKDTrainer.generalized_jsd_loss``, backward, AdamW) every cell of both shapes and
prints the plan's tensors of the training step (no process overhead) against the traced peak; tests/test_distill.py
holds a few of these cells within 8%.  Shape "llama": a GQA Llama student (h 256, 4 layers, vocabulary 4096) under a
wider, deeper teacher, where the divergence terms were counted; shape "qwen2": a tied Qwen2 with biases (h 192, 3
layers, vocabulary 2048) under a teacher of 5 layers, held out.
"""
from __future__ import annotations

import itertools
import json
import sys
import tempfile
from pathlib import Path

STUDENTS = {
    "llama": dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, vocab_size=4096),
    "qwen2": dict(model_type="qwen2", hidden_size=192, intermediate_size=512, num_hidden_layers=3,
                  num_attention_heads=6, num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=True),
}
TEACHERS = {
    "llama": dict(STUDENTS["llama"], hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                  num_attention_heads=12, num_key_value_heads=4),
    "qwen2": dict(STUDENTS["qwen2"], hidden_size=320, intermediate_size=864, num_hidden_layers=5,
                  num_attention_heads=10, num_key_value_heads=2),
}
# (method, gradient checkpointing, sequence length, micro-batch, GKD beta)
CELLS = [cell for cell in itertools.product(("full", "lora"), (False, True), (64, 192), (1, 3), (0.0, 0.5))]


def distill_recipe(folder: Path, shape: str, method: str, checkpointing: bool, seq: int, batch: int, beta: float):
    """A distill recipe of ``shape``'s student and teacher (their config.json written under ``folder``), fp32."""
    from tuner.recipe.io import validate_recipe

    for role, configs in (("student", STUDENTS), ("teacher", TEACHERS)):
        (folder / shape / role).mkdir(parents=True, exist_ok=True)
        (folder / shape / role / "config.json").write_text(json.dumps(configs[shape]))
    return validate_recipe({
        "model": {"id": str(folder / shape / "student"), "dtype": "float32"}, "method": {"kind": method},
        "objective": {"kind": "distill", "teacher": str(folder / shape / "teacher"),
                      "distill": {"beta": beta, "max_new_tokens": 8}},
        "memory": {"mixed_precision": "no", "attention": "sdpa", "gradient_checkpointing": checkpointing},
        "training": {"max_seq_length": seq, "micro_batch_size": batch}, "data": {"eval_fraction": 0}})


def planned_and_traced(recipe) -> tuple[float, float]:
    """(the plan's training-step tensors, the traced peak), in GiB."""
    from tuner.loading.simulate import simulate
    from tuner.planner import plan

    device = plan(recipe).devices[0]
    traced = simulate(recipe)
    if traced.error:
        raise RuntimeError(traced.error)
    return device.total_gib - device.terms["overhead"], traced.peak_gib


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        print("| shape | method | checkpointing | s | b | beta | plan MiB | trace MiB | error |")
        print("|---|---|---|---:|---:|---:|---:|---:|---:|")
        worst = 0.0
        for shape in STUDENTS:
            for cell in CELLS:
                planned, traced = planned_and_traced(distill_recipe(Path(folder), shape, *cell))
                error = planned / traced - 1
                worst = max(worst, abs(error))
                method, checkpointing, seq, batch, beta = cell
                print(f"| {shape} | {method} | {checkpointing} | {seq} | {batch} | {beta:g} | {planned * 1024:.1f} | "
                      f"{traced * 1024:.1f} | {error:+.1%} |", flush=True)
        print(f"worst |error| {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
