"""Round four of gpu_check (issue #54): one cell per tactic the plan offers, MoE, DPO, GRPO, image-text, QLoRA at
long context, and tuner's tactics beside plain transformers defaults.

Pure (no torch): the cells, the recipe change each tactic makes, what it needs installed and its time cost are
tested on the CPU, and every cell's recipe is planned by tuner's planner there (tests/test_gpu_check.py).

Most tactic cells differ from one round-three cell, ``REFERENCE`` (Llama-3.1-8B LoRA, checkpointing, 2048 tokens,
sdpa, micro-batch 4), by their tactic alone, so the reference is the "off" of each on/off pair. Full fine-tuning
of the 8B shape keeps its width and 8 of its 32 layers (layers=8: 2.8B parameters, whose weights, gradients and
AdamW states fit one 80 GB GPU); a layer-reduced shape is planned from a config.json written by ``shape_dir``.

Held out (issue #54, item 3): the cells whose tactic is in ``HELD_OUT`` are never used to tune a planner
constant; they check a change made from the others. They are the baseline pair, GRPO and the image-text cell.
"""
from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from tuner.catalog.models import model_config


@dataclass(frozen=True)
class Tactic:
    """What a tactic changes in the cell's recipe, what it needs installed, and its time beyond the training steps."""

    about: str
    recipe: dict = field(default_factory=dict)  # nested keys merged into gpu_matrix.recipe_data
    needs: tuple[str, ...] = ()  # modules; a cell whose module is missing is recorded "skipped: ... not installed"
    extra_s: float = 0.0  # seconds beyond set-up and steps: a model of its own, compilation, generation
    slowdown: float = 1.0  # step time against the plain step


OWN_MODEL_S = 12.0  # a tactic that wraps or shards the model in place builds a fresh one for itself
TACTICS = {
    "none": Tactic("tuner's recipe as the cell sets it (rounds one to three)"),
    "zero3": Tactic("DeepSpeed ZeRO-3 on one rank", {"memory": {"distributed": "deepspeed", "zero_stage": 3}},
                    ("deepspeed",), OWN_MODEL_S, 1.2),
    "fsdp2": Tactic("FSDP2 on one rank", {"memory": {"distributed": "fsdp"}}, (), OWN_MODEL_S, 1.1),
    "liger": Tactic("Liger's fused kernels", {"memory": {"liger": True}}, ("liger_kernel",)),
    "chunked-loss": Tactic("the chunked linear cross-entropy", {"memory": {"chunked_loss": True}}),
    "activation-offload": Tactic("checkpointed layer inputs held in pinned CPU memory",
                                 {"memory": {"activation_offloading": True}}, (), 0.0, 1.3),
    "packing": Tactic("samples packed into rows without padding", {"data": {"packing": True}}),
    "compile": Tactic("torch.compile", {"memory": {"torch_compile": True}}, (), 60.0),
    "flash": Tactic("flash-attn 2 (the cell's attention; its sdpa twin is the reference)", {}, ("flash_attn",)),
    "lora-experts": Tactic("LoRA on the fused experts too (PEFT target_parameters)", {"method": {"lora": {
        "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}}}, (), OWN_MODEL_S),
    "dpo": Tactic("one DPO step (TRL), the reference being the adapters switched off",
                  {"objective": {"kind": "dpo"}, "data": {"format": "preference"}}, ("trl", "datasets"), OWN_MODEL_S, 2.0),
    "grpo": Tactic("one GRPO step (TRL) generating with transformers", {"objective": {"kind": "grpo", "beta": 0.0, "grpo": {
        "num_generations": 4, "max_completion_length": 64, "rewards": [{"kind": "length"}]}},
        "data": {"format": "prompt"}}, ("trl", "datasets"), OWN_MODEL_S + 25.0, 1.0),
    "grpo-vllm": Tactic("one GRPO step generating with vLLM colocated", {"objective": {"kind": "grpo", "beta": 0.0, "grpo": {
        "num_generations": 4, "max_completion_length": 64, "rewards": [{"kind": "length"}],
        "generation": "vllm_colocate"}}, "data": {"format": "prompt"}}, ("trl", "datasets", "vllm"), OWN_MODEL_S + 60.0, 1.0),
    "image-text": Tactic("an image-text model trained on text rows (the tower loaded and frozen)", {}, (), OWN_MODEL_S),
    "transformers-defaults": Tactic("plain transformers defaults: TrainingArguments() with no bf16 autocast, no "
                                    "checkpointing (the cell's), sdpa, the same adapters",
                                    {"memory": {"mixed_precision": "no"}}),
    "tuner-tactics": Tactic("tuner's chosen tactics (the 8B presets': checkpointing, attention auto, and Liger)",
                            {"memory": {"liger": True}}, (), OWN_MODEL_S - 4),  # the 8B builds in about 8 s
}
HELD_OUT = ("transformers-defaults", "tuner-tactics", "grpo", "grpo-vllm", "image-text")

# Published claims, quoted as claims with their conditions (none of them measured here).
CLAIMS = (
    "unsloth claims 2x faster and >70% less VRAM for Llama 3.1 8B QLoRA on one 80 GB GPU (unsloth README, "
    "against Hugging Face + Flash Attention 2)",
    "Liger Kernel claims +20% throughput and -60% memory for Llama 3 8B on 8xA100 with FSDP1 (Liger README)",
)


def merged(base: dict, change: dict) -> dict:
    """``base`` with ``change``'s nested keys set (a copy; mappings merge, other values replace)."""
    out = dict(base)
    for key, value in change.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def shape_dir(model_id: str, layers: int) -> Path:
    """A folder holding the catalog config of ``model_id`` with ``layers`` decoder layers: the model id the planner
    reads for a layer-reduced shape (written once; the same content every time)."""
    config = {key: value for key, value in model_config(model_id).items() if not key.startswith("_")}
    text = config.get("text_config")
    target = text if isinstance(text, dict) and "num_hidden_layers" in text else config
    target["num_hidden_layers"] = layers
    if isinstance(target.get("layer_types"), list):
        target["layer_types"] = target["layer_types"][:layers]
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", model_id)
    folder = Path(tempfile.gettempdir()) / "tuner-gpu-check-shapes" / f"{slug}-L{layers}"
    folder.mkdir(parents=True, exist_ok=True)
    content = json.dumps(config, indent=1, sort_keys=True)
    path = folder / "config.json"
    if not path.is_file() or path.read_text(encoding="utf-8") != content:
        path.write_text(content, encoding="utf-8")
    return folder


def round_four(cell_class, reference) -> tuple[list, list]:
    """(full, quick) round-four cells, most informative first; ``reference`` is the round-three "off" cell."""
    llama, moe, vlm = "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B", "google/gemma-3-4b-pt"
    full_8b = replace(reference, method="full", micro_batch=2, layers=8)
    def pair(cell):  # plain transformers (no checkpointing, sdpa) beside tuner's tactics (checkpointing, auto)
        return [replace(cell, gradient_checkpointing=False, tactic="transformers-defaults"),
                replace(cell, attention="auto", tactic="tuner-tactics")]

    # micro-batch 1 for LoRA: plain defaults keep every activation (the plan: 76 GiB at mb2 on an 80 GB GPU)
    lora_pair, full_pair = pair(replace(reference, micro_batch=1)), pair(full_8b)
    sharded = [replace(base, tactic=name) for name in ("fsdp2", "zero3") for base in (reference, full_8b)]
    toggles = [replace(reference, tactic=name)
               for name in ("liger", "chunked-loss", "activation-offload", "packing", "compile")]
    toggles.insert(4, replace(reference, attention="flash", tactic="flash"))
    experts = [cell_class(moe, "full", True, 2048, "sdpa", 1, "none", 2),
               cell_class(moe, "lora", True, 2048, "sdpa", 1, "lora-experts", 2)]
    objectives = [cell_class("Qwen/Qwen2.5-1.5B", "lora", True, 1024, "sdpa", 2, "dpo"),
                  cell_class("Qwen/Qwen2.5-0.5B", "lora", True, 512, "sdpa", 4, "grpo"),
                  cell_class("Qwen/Qwen2.5-0.5B", "lora", True, 512, "sdpa", 4, "grpo-vllm")]
    image_text = [cell_class(vlm, "lora", True, 2048, "sdpa", 2, "image-text")]
    long_qlora = [cell_class(llama, "qlora", True, seq, "sdpa", 1) for seq in (4096, 16384)]
    full = lora_pair + full_pair + sharded + toggles + experts + objectives + image_text + long_qlora
    quick = lora_pair + [sharded[0], sharded[2]] + toggles[:1] + experts[1:] + objectives[:2] + image_text
    return full, quick
