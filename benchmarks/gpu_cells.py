"""How gpu_check runs a round-four tactic cell (benchmarks/gpu_tactics.py): whether it can run here, the model it
builds, and what it changes on that model and on the Trainer's arguments.

``unrunnable`` is pure and tested on the CPU; the rest needs torch and runs only on the GPU machine (none of it has
run on a GPU yet: the first run's log is its test). Tactics that patch the model for good (Liger's kernels) or
that the matrix gives a shape of its own (layer-reduced, MoE, image-text) get a freshly built model.
"""
from __future__ import annotations

import importlib.util

from benchmarks.gpu_matrix import MODELS, Cell, architecture, shape
from benchmarks.gpu_tactics import TACTICS

import os
from contextlib import contextmanager
from pathlib import Path

OBJECTIVES = {"dpo", "grpo", "grpo-vllm"}  # TRL's trainers, wrapping the adapters themselves
SHARDED = {"zero3", "fsdp2"}  # partition the model's parameters in place
FRESH_MODEL = {"liger", "tuner-tactics"} | OBJECTIVES | SHARDED  # Liger patches modules in place; TRL wraps them


def unrunnable(cell: Cell) -> str | None:
    """``skipped: why`` for a cell this machine cannot run (a package it needs is not importable), else None."""
    missing = [module for module in TACTICS[cell.tactic].needs if importlib.util.find_spec(module) is None]
    if not missing:
        return None
    twin = " (its sdpa twin is the reference cell)" if cell.tactic == "flash" else ""
    return f"skipped: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not importable{twin}"


def needs_own_model(cell: Cell) -> bool:
    return cell.tactic in FRESH_MODEL


def model_config(cell: Cell) -> dict:
    """The config the cell's random-weight model is built from: round three's architecture of its dense models,
    else the whole catalog config of the cell's shape (MoE, image-text, layer-reduced, the CPU smoke's built-ins)."""
    from tuner.catalog.models import model_config as catalog_config

    if cell.layers is None and cell.model in MODELS:
        return architecture(cell.model)
    return {key: value for key, value in catalog_config(shape(cell)).items()
            if not key.startswith("_") and key not in ("transformers_version", "architectures")}


def build_model(cell: Cell, recipe, device: str | None = None):
    """The cell's architecture with random bf16 weights, initialised on the GPU (the CPU under --cpu-smoke; "meta"
    in the tests, which build every shape), in the class training builds."""
    import torch
    from transformers import AutoConfig

    from tuner.loading.model import trained_class

    data = model_config(cell)
    auto_class, head = trained_class(recipe, data)
    config = AutoConfig.for_model(**data, **head)
    with torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")):
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


@contextmanager
def one_rank(recipe, workdir: Path):
    """ZeRO-3 or FSDP2 on one process as tuner's launch sets them up: the variables ``accelerate launch`` gives
    rank 0 of 1, tuner's deepspeed.json where training_arguments points (run dir = ``workdir``), FSDP2 as the
    FSDP_* variables Accelerate reads from tuner's accelerate config (render/accelerate_config.fsdp_config); all
    of it, and Accelerate's process-wide state, undone afterwards."""
    import socket

    distributed = recipe.memory.distributed
    if distributed not in ("deepspeed", "fsdp"):
        yield
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    variables = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port))
    if distributed == "deepspeed":
        from tuner.render.deepspeed_config import render_deepspeed_config
        from tuner.rundir.layout import DEEPSPEED_CONFIG

        (workdir / DEEPSPEED_CONFIG).write_text(render_deepspeed_config(recipe), encoding="utf-8")
    else:
        from tuner.render.accelerate_config import fsdp_config

        variables |= {"ACCELERATE_USE_FSDP": "true", "ACCELERATE_MIXED_PRECISION": recipe.memory.mixed_precision}
        variables |= {key.upper(): str(value).lower() if isinstance(value, bool) else str(value)
                      for key, value in fsdp_config(recipe, None).items()}
    before = dict(os.environ)  # TrainingArguments adds ACCELERATE_USE_DEEPSPEED and the like, which later cells must not see
    os.environ.update(variables)
    try:
        if distributed == "deepspeed" and not recipe.uses_gpu:
            from tuner.train.deepspeed_cpu import init_cpu_deepspeed

            init_cpu_deepspeed()
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)
        from accelerate.state import AcceleratorState
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
        AcceleratorState._reset_state(reset_partial_state=True)
        import torch.distributed

        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def collator(recipe):
    """Packing: the micro-batch flattened into one row with per-sample positions (transformers'
    DataCollatorWithFlattening, as tuner packs); else the plain stacking collator."""
    from transformers import DataCollatorWithFlattening, default_data_collator

    return DataCollatorWithFlattening() if recipe.data.packing else default_data_collator


def undo_tactics(model) -> None:
    """Drop forwards patched on module instances (the chunked loss; Accelerate's autocast wrapper)."""
    for module in model.modules():
        module.__dict__.pop("forward", None)
