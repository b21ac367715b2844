"""The analytic plan against fake-tensor traces of the real step, on cells the planner was fitted to and on held-out ones.

Run: python benchmarks/trace_agreement.py [SET ...]      (sets: fit, held-out, held-out-autocast, held-out-bf16)

``fit`` is tests/test_planner_simulation.py's L8 design (three architectures, fp32, no autocast): the cells the
activation terms were calibrated on.  The ``held-out`` sets use three other shapes (MQA Mistral, an MHA Llama with
a large vocabulary, an untied Qwen2 with biases) at other lengths and batches, in the same L8 design; they are run
to compare planners and never used to choose a term: ``held-out`` in fp32,
``held-out-autocast`` with fp32 weights under bf16 autocast, ``held-out-bf16`` with bf16 weights and no autocast.
For each cell: the plan's allocated tensors of the training step against MemTracker's peak; then the median and
worst absolute error per set.  To compare with another version of the planner, run this file with that version's
checkout first on PYTHONPATH (the script reads only ``plan``, ``simulate`` and ``validate_recipe``).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "tests"))

HELD_OUT_ARCHITECTURES = {
    "mistral-mqa": dict(model_type="mistral", hidden_size=224, intermediate_size=600, num_hidden_layers=3,
                        num_attention_heads=7, num_key_value_heads=1, vocab_size=1500),
    "llama-mha-v4k": dict(model_type="llama", hidden_size=96, intermediate_size=264, num_hidden_layers=4,
                          num_attention_heads=3, num_key_value_heads=3, vocab_size=4096),
    "qwen2-untied": dict(model_type="qwen2", hidden_size=192, intermediate_size=480, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=3, vocab_size=2500, tie_word_embeddings=False),
}
HELD_OUT_LEVELS = {"method": ("full", "lora"), "checkpointing": (False, True), "attention": ("sdpa", "eager"),
                   "seq": (80, 224), "batch": (2, 4)}
SETS = {  # name -> (architectures, levels, model dtype, mixed precision)
    "held-out": ("held", "float32", "no"),
    "held-out-autocast": ("held", "float32", "bf16"),
    "held-out-bf16": ("held", "bfloat16", "no"),
    "fit": ("fit", "float32", "no"),
}


def cells(which: str):
    from test_planner_simulation import ARCHITECTURES, L8, LEVELS

    architectures, levels = (ARCHITECTURES, LEVELS) if which == "fit" else (HELD_OUT_ARCHITECTURES, HELD_OUT_LEVELS)
    for shift, arch in enumerate(architectures):
        for row in L8:
            row = tuple(level ^ ((shift >> i) & 1) for i, level in enumerate(row))
            yield arch, architectures[arch], *(values[level] for values, level in zip(levels.values(), row))


def allocated_step_gib(memory_plan) -> float:
    device = memory_plan.devices[0]
    if hasattr(device, "phase_gib"):
        return device.phase_gib("training step", ("allocated",))
    return device.total_gib - device.terms["overhead"]  # planners before issue 15: one step, overhead apart


def run(name: str, root: Path) -> list[float]:
    from tuner.planner import plan
    from tuner.loading.simulate import simulate
    from tuner.recipe.io import validate_recipe

    which, dtype, mixed = SETS[name]
    errors = []
    for arch, config, method, checkpointing, attention, seq, batch in cells(which):
        directory = root / arch
        directory.mkdir(exist_ok=True)
        (directory / "config.json").write_text(json.dumps(config))
        recipe = validate_recipe({"model": {"id": str(directory), "dtype": dtype}, "method": {"kind": method},
                                  "memory": {"mixed_precision": mixed, "attention": attention,
                                             "gradient_checkpointing": checkpointing, "max_seq_length": seq,
                                             "micro_batch_size": batch}})
        simulated = simulate(recipe)
        assert simulated.error is None, simulated.error
        error = (allocated_step_gib(plan(recipe)) / simulated.peak_gib - 1) * 100
        errors.append(error)
        print(f"  {arch:14} {method:4} {'ckpt' if checkpointing else '    '} {attention:5} s={seq:<4} b={batch} "
              f"{error:+6.1f}%", flush=True)
    absolute = [abs(e) for e in errors]
    print(f"{name}: {len(errors)} cells, median |error| {statistics.median(absolute):.1f}%, worst {max(absolute):.1f}% "
          f"(signed {min(errors):+.1f} .. {max(errors):+.1f})", flush=True)
    return errors


def main(argv: list[str]) -> int:
    import logging

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as root:
        for name in argv or list(SETS):
            run(name, Path(root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
