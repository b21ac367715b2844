"""Training entrypoint: ``python -m tuner.train RUN_DIR/recipe.lock.yaml``, run on every rank by ``accelerate launch``.

Shape: setup (recipe, model, data) -> train (transformers Trainer) -> save -> report.
The run directory is the folder holding the lock file.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tuner.events import EVENTS_FILE, write_event
from tuner.recipe import RecipeError, load_recipe
from tuner.recipe.schema import Recipe
from tuner.render.deepspeed_config import DEEPSPEED_CONFIG

log = logging.getLogger("tuner")

CHECKPOINTS_DIR = "checkpoints"
FINAL_DIR = "final"


def training_arguments(recipe: Recipe, run_dir: Path):
    from transformers import TrainingArguments

    mem, training = recipe.memory, recipe.training
    evaluate = recipe.data.eval_fraction > 0
    return TrainingArguments(
        output_dir=str(run_dir / CHECKPOINTS_DIR),
        per_device_train_batch_size=mem.micro_batch_size,
        per_device_eval_batch_size=mem.micro_batch_size,
        gradient_accumulation_steps=mem.gradient_accumulation_steps,
        learning_rate=training.learning_rate,
        lr_scheduler_type=training.lr_scheduler,
        num_train_epochs=training.epochs,
        max_steps=training.max_steps or -1,
        warmup_steps=training.warmup_steps,
        weight_decay=training.weight_decay,
        max_grad_norm=training.max_grad_norm,
        logging_steps=training.logging_steps,
        save_strategy="steps" if training.save_steps else "no",
        save_steps=training.save_steps or 500,
        save_total_limit=training.save_total_limit,
        eval_strategy=("steps" if training.eval_steps else "epoch") if evaluate else "no",
        eval_steps=training.eval_steps,
        seed=training.seed,
        data_seed=training.seed,
        bf16=mem.mixed_precision == "bf16",
        fp16=mem.mixed_precision == "fp16",
        gradient_checkpointing=mem.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if mem.gradient_checkpointing else None,
        optim=mem.optimizer,
        torch_compile=mem.torch_compile,
        use_cpu=not recipe.uses_gpu,
        deepspeed=str(run_dir / DEEPSPEED_CONFIG) if mem.distributed == "deepspeed" else None,
        report_to="none",
        remove_unused_columns=False,
        disable_tqdm=True,
        logging_first_step=True,
    )


def resume_checkpoint(recipe: Recipe, run_dir: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    resume = recipe.training.resume
    if resume == "never":
        return None
    if resume == "auto":
        directory = run_dir / CHECKPOINTS_DIR
        return get_last_checkpoint(str(directory)) if directory.is_dir() else None
    return resume


def train(recipe: Recipe, run_dir: Path) -> int:
    from transformers import DataCollatorForSeq2Seq, Trainer

    from tuner.loading.model import apply_lora, load_model, load_tokenizer
    from tuner.train.callbacks import EventsCallback
    from tuner.train.dataset import prepare_data
    from tuner.train.rank_trace import RankTrace, tracing_ranks

    events = run_dir / EVENTS_FILE
    # before the model: under ZeRO-3 the arguments' DeepSpeed config makes from_pretrained shard while loading
    args = training_arguments(recipe, run_dir)
    if recipe.memory.distributed == "deepspeed" and not recipe.uses_gpu:
        # Accelerate sets up DeepSpeed's communication only on accelerators; ZeRO-3's sharded load needs it
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    tokenizer = load_tokenizer(recipe)
    model = load_model(recipe)
    if recipe.method.kind in ("lora", "qlora"):
        model = apply_lora(model, recipe)
    data = prepare_data(recipe, tokenizer)
    tokens_per_step = recipe.memory.micro_batch_size * recipe.memory.gradient_accumulation_steps * recipe.memory.max_seq_length
    collator = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
    trace = RankTrace(events, collator) if tracing_ranks() else None
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.eval,
        data_collator=trace.collate if trace else collator,
        processing_class=tokenizer,
        callbacks=[EventsCallback(events, tokens_per_step), *([trace] if trace else [])],
    )
    result = trainer.train(resume_from_checkpoint=resume_checkpoint(recipe, run_dir))
    final = run_dir / FINAL_DIR
    trainer.save_model(str(final))
    metrics = dict(result.metrics)
    if data.eval is not None:
        metrics.update(trainer.evaluate())  # every rank: evaluation is a collective
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(final))
        (final / "recipe.lock.yaml").write_text((run_dir / "recipe.lock.yaml").read_text())
        write_event(events, "finished", step=trainer.state.global_step, final_dir=str(final),
                    **{k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner.train", description=__doc__)
    parser.add_argument("lock", help="the run directory's recipe.lock.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[tuner] %(message)s")
    lock = Path(args.lock)
    try:
        recipe = load_recipe(lock)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return train(recipe, lock.parent)


if __name__ == "__main__":
    sys.exit(main())
