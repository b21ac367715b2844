"""The cells gpu_check measures, their time estimate and the tuner recipe of each.

Pure (no torch): the matrix, its pruning and every cell's recipe are tested on the CPU.

The full cross product (3 models x full/LoRA/QLoRA x checkpointing on/off x 2 sequence lengths x
sdpa/eager x micro-batch 1/4 = 144 cells) would take about 7 minutes on an H200 by the estimate below
(``estimate_seconds``), so it is pruned to fit 6 minutes with room for the estimate being wrong:
- eager attention is measured only without gradient checkpointing, at the long sequence: its extra
  memory is the s x s score matrix every layer keeps for the backward pass, which checkpointing drops
  and a short sequence hides; sdpa gets the whole grid of the other four factors;
- every other combination is kept, for all three models: 90 cells, estimated at about 4.7 minutes
  (measured on an H200, 2026-11-29: 282 s, model building and 4-bit reloads included).
``--quick`` (under 2 minutes) keeps, per model, each method at the long sequence, micro-batch 4,
sdpa, with and without checkpointing, plus eager for full fine-tuning on the 0.5B; it leaves out QLoRA
on the 8B, whose quantised reload alone took 25 s: 17 cells, about 1.5 minutes (measured: 87 s).
Models run largest first, so a time budget that runs out drops the cheap cells, not the 8B.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from benchmarks.gpu_tactics import TACTICS, merged, round_four, shape_dir
from tuner.catalog.gpus import GPUS, GpuSpec
from tuner.catalog.models import model_facts

METHODS = ("full", "lora", "qlora")
SEQ_SHORT, SEQ_LONG = 512, 2048
MICRO_BATCHES = (1, 4)
STEPS = 3  # the first is a warm-up; peak memory needs the second (optimizer states exist by then)

# Time-estimate assumptions; a run prints each cell's real seconds to correct them.
ASSUMED_MFU = 0.30  # share of the catalog's peak bf16 rate a training step reaches
MIN_STEP_S = 0.10  # small models are bound by kernel launches, not FLOPs
CELL_OVERHEAD_S = 1.5  # Trainer set-up, adapter wrapping, freeing memory between cells
BUILD_S_PER_B = 1.0  # random bf16 weights initialised on the GPU
QUANTIZED_LOAD_S_PER_B = 4.0  # saving the random weights, then loading them 4-bit through tuner's loader
START_S = 20.0  # interpreter, imports, CUDA context


MODELS = ("meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-0.5B")  # hub ids from tuner's catalog


def params_b(model_id: str) -> float:
    """Billions of parameters, as the catalog counts them (a run also counts the built model)."""
    return model_facts(model_id).total_params / 1e9


def architecture(model_id: str) -> dict:
    """The transformers config that builds the catalog's architecture with random weights."""
    facts = model_facts(model_id)
    return dict(model_type=facts.model_type, hidden_size=facts.hidden_size, num_hidden_layers=facts.num_layers,
                num_attention_heads=facts.num_heads, num_key_value_heads=facts.num_kv_heads, head_dim=facts.head_dim,
                intermediate_size=facts.intermediate_size, vocab_size=facts.vocab_size,
                tie_word_embeddings=facts.tie_word_embeddings, max_position_embeddings=facts.max_position_embeddings)


@dataclass(frozen=True)
class Cell:
    """One measured configuration: everything that changes the peak memory or the speed."""

    model: str
    method: str
    gradient_checkpointing: bool
    seq_len: int
    attention: str
    micro_batch: int
    tactic: str = "none"  # a key of gpu_tactics.TACTICS (round four); "none" in the earlier rounds' CSVs
    layers: int | None = None  # decoder layers kept of the catalog's architecture (None: all of them)

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.micro_batch

    @property
    def label(self) -> str:
        checkpointing = "gc" if self.gradient_checkpointing else "no-gc"
        name = self.model.rsplit("/", 1)[-1] + (f"-L{self.layers}" if self.layers else "")
        tactic = "" if self.tactic == "none" else f" {self.tactic}"
        return f"{name} {self.method} {checkpointing} s{self.seq_len} {self.attention} mb{self.micro_batch}{tactic}"


def _grid(model: str, methods, checkpointing, seq_lens, attentions, micro_batches) -> list[Cell]:
    return [Cell(model, method, gc, seq, attention, mb)
            for method in methods for gc in checkpointing for seq in seq_lens
            for attention in attentions for mb in micro_batches]


def round_three_full() -> list[Cell]:
    cells = []
    for model in MODELS:
        cells += _grid(model, METHODS, (False, True), (SEQ_SHORT, SEQ_LONG), ("sdpa",), MICRO_BATCHES)
        cells += _grid(model, METHODS, (False,), (SEQ_LONG,), ("eager",), MICRO_BATCHES)
    return _in_run_order(cells)


def round_three_quick() -> list[Cell]:
    cells = []
    for model in MODELS:
        methods = ("full", "lora") if params_b(model) > 5 else METHODS
        cells += _grid(model, methods, (False, True), (SEQ_LONG,), ("sdpa",), (4,))
    cells.append(Cell(MODELS[-1], "full", False, SEQ_LONG, "eager", 4))
    return _in_run_order(cells)


REFERENCE = Cell(MODELS[0], "lora", True, SEQ_LONG, "sdpa", 4)  # round four's "off" twin of every tactic cell


def full_matrix() -> list[Cell]:
    """Round four: the reference, then the baseline pairs, sharding, the on/off tactics, MoE, objectives, image-text
    and long-context QLoRA (gpu_tactics.round_four), most informative first."""
    return _deduplicated([REFERENCE] + round_four(Cell, REFERENCE)[0])


def quick_matrix() -> list[Cell]:
    return _deduplicated([REFERENCE] + round_four(Cell, REFERENCE)[1])


# gpu_check --cpu-smoke: the plain, baseline, chunked-loss, packing, DPO, GRPO and ZeRO-3 paths on tuner's tiny
# Llama, image-text on its tiny LLaVA, full and LoRA-on-experts on its tiny Qwen3-MoE (FSDP2 needs a GPU: tuner
# refuses it on CPU ranks; Liger, flash, offloading and compile need one too)
CPU_SMOKE = [Cell("builtin:demo", method, True, 128, "sdpa", 4, tactic)
             for method, tactic in (("full", "none"), ("lora", "none"), ("lora", "transformers-defaults"),
                                    ("lora", "chunked-loss"), ("lora", "packing"), ("lora", "dpo"), ("lora", "grpo"),
                                    ("lora", "zero3"))]
CPU_SMOKE += [Cell("builtin:demo-vlm", "lora", True, 64, "sdpa", 2, "image-text"),
              Cell("builtin:demo-moe", "full", True, 64, "sdpa", 2), Cell("builtin:demo-moe", "lora", True, 64, "sdpa", 2,
                                                                        "lora-experts")]
ROUNDS = {3: (round_three_full, round_three_quick), 4: (full_matrix, quick_matrix)}  # --round: (full, --quick)


def _deduplicated(cells: list[Cell]) -> list[Cell]:
    return list(dict.fromkeys(cells))


def _in_run_order(cells: list[Cell]) -> list[Cell]:
    """Largest model first; per model bf16 cells (full, then LoRA) before the quantised ones."""
    return sorted(cells, key=lambda cell: (MODELS.index(cell.model), METHODS.index(cell.method)))


def shape(cell: Cell) -> str:
    """The model id the recipe and the planner read: the catalog id, or a layer-reduced shape's folder."""
    return str(shape_dir(cell.model, cell.layers)) if cell.layers else cell.model


def cell_params_b(cell: Cell, active: bool = False) -> float:
    """Billions of parameters of the cell's shape (``active``: those one token passes through, for an MoE)."""
    facts = model_facts(shape(cell))
    return (facts.active_params() if active else facts.total_params) / 1e9


def estimate_seconds(cells: list[Cell], peak_bf16_tflops: float) -> float:
    """Wall-clock estimate of measuring ``cells``, model building included (assumptions above)."""
    total = START_S
    for model in {(cell.model, cell.layers) for cell in cells}:
        size = cell_params_b(next(cell for cell in cells if (cell.model, cell.layers) == model))
        total += BUILD_S_PER_B * size
        if any((cell.model, cell.layers) == model and cell.method == "qlora" for cell in cells):
            total += QUANTIZED_LOAD_S_PER_B * size
    for cell in cells:
        tactic = TACTICS[cell.tactic]
        total += CELL_OVERHEAD_S + tactic.extra_s + STEPS * _step_seconds(cell, peak_bf16_tflops) * tactic.slowdown
    return total


def _step_seconds(cell: Cell, peak_bf16_tflops: float) -> float:
    """FLOPs per token: 6N for full training, 4N with frozen weights (no weight gradients), +2N to recompute."""
    flops_per_param = (6 if cell.method == "full" else 4) + (2 if cell.gradient_checkpointing else 0)
    slowdown = (1.3 if cell.method == "qlora" else 1.0) * (1.2 if cell.attention == "eager" else 1.0)
    flops = flops_per_param * cell_params_b(cell, active=True) * 1e9 * cell.tokens_per_step * slowdown
    return max(MIN_STEP_S, flops / (ASSUMED_MFU * peak_bf16_tflops * 1e12))


def catalog_gpu(device_name: str, memory_gib: float) -> GpuSpec | None:
    """The catalog entry of a device as torch names it ("NVIDIA H100 80GB HBM3" -> H100-80GB), if any.

    A catalog name matches when its model part (before any "-") is in the device name; among several
    (L4 and L40S, A100-40GB and A100-80GB) the one whose memory is nearest wins.
    """
    def squeeze(text: str) -> str:
        return re.sub(r"[^A-Z0-9]", "", text.upper())

    device = squeeze(device_name)
    matches = [spec for spec in GPUS.values() if squeeze(spec.name.split("-")[0]) in device]
    return min(matches, key=lambda spec: abs(spec.memory_gib - memory_gib), default=None)


def recipe_data(cell: Cell, gpu: str | None, gpu_memory_gib: float) -> dict:
    """The recipe (as plain data) that trains ``cell`` on one GPU (on the CPU for ``gpu_memory_gib`` 0): what both
    the planner and the run read."""
    return merged({
        "name": "gpu-check",
        "model": {"id": shape(cell), "dtype": "bfloat16"},
        "hardware": {"machines": 1, "gpus_per_machine": 1, "gpu": gpu, "gpu_memory_gb": round(gpu_memory_gib, 2)}
        if gpu_memory_gib else {"machines": 1, "gpus_per_machine": 0},  # 0 GiB: the CPU (gpu_check --cpu-smoke)
        "method": {"kind": cell.method, "quantization": {"bits": 4} if cell.method == "qlora" else None},
        "memory": {
            "gradient_checkpointing": cell.gradient_checkpointing,
            "attention": cell.attention,
            "mixed_precision": "bf16",
        },
        "data": {"eval_fraction": 0},
        "training": {"max_steps": STEPS, "save_steps": None, "warmup_steps": 0, "micro_batch_size": cell.micro_batch,
                     "gradient_accumulation_steps": 1, "max_seq_length": cell.seq_len},
    }, TACTICS[cell.tactic].recipe)


def build_recipe(cell: Cell, gpu: str | None, gpu_memory_gib: float):
    """The validated tuner Recipe of ``cell`` (needs pydantic, not torch)."""
    from tuner.recipe import validate_recipe

    return validate_recipe(recipe_data(cell, gpu, gpu_memory_gib))
