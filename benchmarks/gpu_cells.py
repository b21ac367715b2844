"""How gpu_check runs a round-four tactic cell (benchmarks/gpu_tactics.py): whether it can run here, the model it
builds, and what it changes on that model and on the Trainer's arguments.

``unrunnable`` is pure and tested on the CPU; the rest needs torch and runs only on the GPU machine (none of it has
run on a GPU yet: the first run's log is its test). Tactics that patch the model for good (Liger's kernels) or
that the matrix gives a shape of its own (layer-reduced, MoE, image-text) get a freshly built model.
"""
from __future__ import annotations

import importlib.util

from benchmarks.gpu_matrix import Cell, architecture, shape
from benchmarks.gpu_tactics import TACTICS

# Tactics whose one-process set-up is not written yet: recorded as skipped with this reason, never faked.
NO_RUNNER = {
    "zero3": "no one-rank runner yet (needs tuner's deepspeed.json and a one-process group)",
    "fsdp2": "no one-rank runner yet (needs Accelerate's FSDP2 plugin on a one-process group)",
}
OBJECTIVES = {"dpo", "grpo", "grpo-vllm"}  # TRL's trainers, wrapping the adapters themselves
FRESH_MODEL = {"liger", "tuner-tactics"} | OBJECTIVES  # Liger patches the modules in place; TRL wraps the model


def unrunnable(cell: Cell) -> str | None:
    """``skipped: why`` for a cell this machine cannot run (a package it needs, a runner not written), else None."""
    missing = [module for module in TACTICS[cell.tactic].needs if importlib.util.find_spec(module) is None]
    if missing:
        twin = " (its sdpa twin is the reference cell)" if cell.tactic == "flash" else ""
        return f"skipped: {', '.join(missing)} is not importable{twin}"
    if cell.tactic in NO_RUNNER:
        return f"skipped: {NO_RUNNER[cell.tactic]}"
    return None


def needs_own_model(cell: Cell) -> bool:
    return cell.tactic in FRESH_MODEL


def model_config(cell: Cell) -> dict:
    """The config the cell's random-weight model is built from: the catalog architecture of a dense catalog model
    (rounds one to three), else the whole catalog config of its shape (MoE, image-text, layer-reduced)."""
    from tuner.catalog.models import model_config as catalog_config

    if cell.layers is None and cell.tactic not in ("image-text",) and cell.model != "Qwen/Qwen3-30B-A3B":
        return architecture(cell.model)
    return {key: value for key, value in catalog_config(shape(cell)).items()
            if not key.startswith("_") and key not in ("transformers_version", "architectures")}


def build_model(cell: Cell, recipe):
    """The cell's architecture with random bf16 weights, initialised on the GPU (the CPU under --cpu-smoke), in the
    class training builds."""
    import torch
    from transformers import AutoConfig

    from tuner.loading.model import trained_class

    data = model_config(cell)
    auto_class, head = trained_class(recipe, data)
    config = AutoConfig.for_model(**data, **head)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        return auto_class.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")


def apply_tactic(model, cell: Cell, recipe, args):
    """The model and arguments with the cell's tactic applied: Liger through the Trainer, the chunked loss on the
    model (undone by ``undo_tactics``), transformers' plain defaults for the baseline; the rest is in the recipe
    already (checkpointing offload, torch.compile, attention)."""
    from tuner.loading.model import choose_liger

    if recipe.memory.liger:
        args.use_liger_kernel, _ = choose_liger(True, model.config.model_type, True)
    if recipe.memory.chunked_loss:
        from tuner.loading.chunked_loss import enable_chunked_loss

        enable_chunked_loss(model)
    if cell.tactic == "transformers-defaults":
        from transformers import TrainingArguments

        args = TrainingArguments(output_dir=args.output_dir, per_device_train_batch_size=cell.micro_batch,
                                 max_steps=args.max_steps, save_strategy="no", report_to=[], disable_tqdm=True)
    return model, args


def word_tokenizer(vocab_size: int):
    """A tokenizer of ``vocab_size`` words "w0" ... (no download): TRL's trainers read text, and random text of
    n such words is exactly n tokens of the random-weight model's vocabulary; w0 is padding and the end of text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{index}": index for index in range(vocab_size)}, unk_token="w1"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="w0", eos_token="w0", unk_token="w1")


def random_words(count: int, vocab_size: int, generator) -> str:
    return " ".join(f"w{index}" for index in generator.integers(2, vocab_size, count))


def objective_trainer(model, cell: Cell, recipe, args, callbacks, steps: int):
    """TRL's DPOTrainer (random preference pairs: a prompt of half the sequence, two answers of the rest) or
    GRPOTrainer (random prompts, tuner's reward functions, generation as the recipe says) for ``steps`` steps."""
    import numpy
    from datasets import Dataset

    from tuner.loading.model import lora_config

    vocab_size = model.config.get_text_config().vocab_size
    tokenizer, generator = word_tokenizer(vocab_size), numpy.random.default_rng(0)
    peft_config = None if recipe.method.kind == "full" else lora_config(recipe)
    if cell.tactic == "dpo":
        from trl import DPOTrainer

        half = cell.seq_len // 2
        rows = [{"prompt": random_words(half, vocab_size, generator),
                 "chosen": random_words(half - 1, vocab_size, generator),
                 "rejected": random_words(half - 1, vocab_size, generator)} for _ in range(cell.micro_batch * steps)]
        return DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=callbacks, peft_config=peft_config)
    from trl import GRPOTrainer

    from tuner.train.rewards import reward_functions

    grpo = recipe.objective.grpo
    prompts = cell.micro_batch * steps // grpo.num_generations
    prompt_length = cell.seq_len - grpo.max_completion_length
    rows = [{"prompt": random_words(prompt_length, vocab_size, generator)} for _ in range(max(prompts, 1))]
    functions, reward_tokenizers = reward_functions(recipe)
    return GRPOTrainer(model=model, reward_funcs=functions, args=args, train_dataset=Dataset.from_list(rows),
                       processing_class=tokenizer, reward_processing_classes=reward_tokenizers, callbacks=callbacks,
                       peft_config=peft_config)


def collator(recipe):
    """Packing: the micro-batch flattened into one row with per-sample positions (transformers'
    DataCollatorWithFlattening, as tuner packs); else the plain stacking collator."""
    from transformers import DataCollatorWithFlattening, default_data_collator

    return DataCollatorWithFlattening() if recipe.data.packing else default_data_collator


def undo_tactics(model) -> None:
    """Drop forwards patched on module instances (the chunked loss; Accelerate's autocast wrapper)."""
    for module in model.modules():
        module.__dict__.pop("forward", None)
