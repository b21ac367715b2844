"""The plan against fake-tensor traces for what a recipe sets beyond the main factors: Gemma-2 (soft-capped eager
attention and logits), modules_to_save, LoRA on lm_head/embed_tokens, and the evaluation phase.

Every set runs shapes held out from the ones the terms were found on (found on: a Gemma-2 of h 128 in fp32, a
Llama of h 128 for modules_to_save and evaluation); prints one markdown row per set: cells, median and worst
|error| of the plan's allocated tensors of that phase against the traced peak.  ``python
benchmarks/recipe_settings_traces.py [--cells] [--sets 1,2]`` (20-30 minutes on two busy cores; ``--sets``: only those
rows, counted from 0).  ``--record FILE`` keeps each cell's traced peak; ``--replay FILE`` plans the same cells
against those peaks without tracing, so an older planner (its checkout first on ``PYTHONPATH``) is compared with the
same traces: the table's "before" columns.
"""
from __future__ import annotations

import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

from tuner.planner import plan
from tuner.planner.items import EVAL, TRAINING_STEP
from tuner.recipe.io import validate_recipe

GEMMA2 = dict(model_type="gemma2", hidden_size=192, intermediate_size=512, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=3, head_dim=32, vocab_size=1024)
QWEN2_TIED = dict(model_type="qwen2", hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=6,
                  num_key_value_heads=2, vocab_size=640, tie_word_embeddings=True)
PHI3 = dict(model_type="phi3", hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=384, pad_token_id=0, eos_token_id=1)
MISTRAL = dict(model_type="mistral", hidden_size=160, intermediate_size=432, num_hidden_layers=3, num_attention_heads=5,
               num_key_value_heads=1, vocab_size=2048)
PRECISIONS = {"fp32": ("float32", "no"), "bf16": ("bfloat16", "bf16"), "fp32+autocast": ("float32", "bf16")}
GRID = list(itertools.product(("full", "lora"), (False, True), (64, 192), (1, 3)))  # method, checkpointing, s, b


def _merge(into: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict):
            _merge(into.setdefault(key, {}), value)
        else:
            into[key] = value
    return into


def _model_folder(config: dict, root: Path) -> Path:
    """One folder per config: the planner caches a model's facts by its path."""
    folder = root / f"{config['model_type']}-{abs(hash(json.dumps(config, sort_keys=True)))}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _error(config: dict, precision: str, method: str, checkpointing: bool, seq: int, batch: int, extra: dict,
           evaluation: bool, root: Path, traces: dict, cell: str) -> float:
    """The plan's error against the cell's traced peak (traced now unless ``traces`` holds it; kept there)."""
    folder = _model_folder(config, root)
    dtype, mixed = PRECISIONS[precision]
    recipe = validate_recipe(_merge({"model": {"id": str(folder), "dtype": dtype}, "method": {"kind": method},
                                     "memory": {"mixed_precision": mixed, "attention": "auto",
                                                "gradient_checkpointing": checkpointing, "max_seq_length": seq,
                                                "micro_batch_size": batch}}, json.loads(json.dumps(extra))))
    device = plan(recipe).devices[0]
    predicted = device.moment_gib(EVAL, ("allocated",)) if evaluation else device.phase_gib(TRAINING_STEP, ("allocated",))
    if cell not in traces:
        from tuner.loading.simulate import simulate  # not needed to replay (an older planner may lack evaluation=)

        traced = simulate(recipe, evaluation=evaluation)
        assert traced.error is None, traced.error
        traces[cell] = traced.peak_gib
    return predicted / traces[cell] - 1


SETS = [  # (name, config, precisions, grid filter, extra recipe settings, evaluation)
    ("Gemma-2 (h 192, 3 layers), training step", GEMMA2, ("fp32", "bf16", "fp32+autocast"), None, {}, False),
    ("modules_to_save [lm_head], tied Qwen2", QWEN2_TIED, ("fp32", "bf16"), "lora",
     {"method": {"lora": {"modules_to_save": ["lm_head"]}}}, False),
    ("modules_to_save [embed_tokens], Gemma-2", GEMMA2, ("fp32", "bf16"), "lora",
     {"method": {"lora": {"modules_to_save": ["embed_tokens"]}}}, False),
    ("modules_to_save [norm], MQA Mistral", MISTRAL, ("fp32", "bf16"), "lora",
     {"method": {"lora": {"modules_to_save": ["norm"]}}}, False),
    ("LoRA on [q_proj, v_proj, lm_head], MQA Mistral", MISTRAL, ("fp32",), "lora",
     {"method": {"lora": {"target_modules": ["q_proj", "v_proj", "lm_head"]}}}, False),
    ("LoRA on [qkv_proj, embed_tokens], Phi-3", PHI3, ("fp32",), "lora",
     {"method": {"lora": {"target_modules": ["qkv_proj", "embed_tokens"]}}}, False),
    ("evaluation, tied Qwen2 and Phi-3", None, ("fp32", "bf16"), "nockpt", {}, True),
    ("evaluation, Gemma-2", GEMMA2, ("fp32", "bf16"), "nockpt", {}, True),
]


def main() -> None:
    def option(name: str) -> str | None:
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None

    show_cells = "--cells" in sys.argv
    chosen = [int(n) for n in option("--sets").split(",")] if option("--sets") else range(len(SETS))
    record, replay = option("--record"), option("--replay")
    traces = json.loads(Path(replay).read_text()) if replay else {}
    print("| set | cells | median abs error | worst |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, config, precisions, which, extra, evaluation in (SETS[n] for n in chosen):
            errors = []
            configs = [config] if config else [QWEN2_TIED, PHI3]
            for cfg, precision, (method, checkpointing, seq, batch) in itertools.product(configs, precisions, GRID):
                if which == "lora" and method != "lora" or which == "nockpt" and checkpointing:
                    continue
                cell = f"{name}: {cfg['model_type']} {precision} {method} ckpt={checkpointing} s={seq} b={batch}"
                if replay and cell not in traces:
                    continue  # replayed: only the cells recorded
                error = _error(cfg, precision, method, checkpointing, seq, batch, extra, evaluation, folder, traces,
                               cell)
                errors.append(error)
                if record:
                    Path(record).write_text(json.dumps(traces, indent=1))
                if show_cells:
                    print(f"  {cell.split(': ', 1)[1]}: {error:+.1%}", flush=True)
            if not errors:
                continue
            worst = max(errors, key=abs)
            print(f"| {name} | {len(errors)} | {statistics.median(map(abs, errors)):.1%} | {worst:+.1%} |", flush=True)


if __name__ == "__main__":
    main()
