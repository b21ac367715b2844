"""Training entrypoint: ``python -m tuner.train RUN_DIR/recipe.lock.yaml [--profile N]``, run on every rank
by ``accelerate launch``.

Shape: setup (recipe, resume check, data, model) -> train (transformers Trainer, or TRL's for dpo/kto) -> save
-> report.  The run directory is the folder holding the lock file.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from tuner.recipe import RecipeError, load_recipe
from tuner.recipe.schema import Recipe
from tuner.rundir.checkpoints import CheckpointRefused
from tuner.rundir.events import BAD_INPUT, DISK_FULL, Error, Finished, Machines, Memory, write_event
from tuner.rundir.layout import DEEPSPEED_CONFIG, EVENTS_FILE, FINAL_DIR, MEMORY_REPORT, MERGED_DIR, PROFILE_DIR
from tuner.reason import terminal_text

log = logging.getLogger("tuner")


def checkpointing_arguments(arguments_class, enabled: bool, offload: bool = False) -> dict:
    """Non-reentrant activation checkpointing under the option's name in this transformers release
    (``activation_checkpointing`` from 5.24, ``gradient_checkpointing`` before); ``offload`` holds the
    checkpointed layer inputs in pinned host memory (the Trainer passes it to ``activation_checkpointing_enable``)."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(arguments_class)}
    name = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    kwargs = {"use_reentrant": False, **({"offload": True} if offload else {})}
    return {name: enabled, f"{name}_kwargs": kwargs if enabled else None}


def training_arguments(recipe: Recipe, run_dir: Path):
    """transformers' TrainingArguments, or for dpo/kto/grpo/distill the TRL config (a subclass) with the objective's
    settings (which may replace the common ones)."""
    from transformers import TrainingArguments

    from tuner.rundir.layout import CHECKPOINTS_DIR
    from tuner.train.parallelism import loads_sharded
    from tuner.train.trackers import tracker_arguments

    arguments_class, objective = TrainingArguments, {}
    if recipe.objective.preference:
        from tuner.train.preference import objective_arguments

        arguments_class, objective = objective_arguments(recipe)
    elif recipe.objective.kind == "grpo":
        from tuner.train.grpo import grpo_arguments

        arguments_class, objective = grpo_arguments(recipe)
    elif recipe.objective.kind == "reward":
        from tuner.train.reward_model import reward_arguments

        arguments_class, objective = reward_arguments(recipe)
    elif recipe.objective.kind == "distill":
        from tuner.train.distill import distill_arguments

        arguments_class, objective = distill_arguments(recipe)
    mem, training = recipe.memory, recipe.training
    evaluate = recipe.data.eval_fraction > 0
    common = dict(
        output_dir=str(run_dir / CHECKPOINTS_DIR),
        per_device_train_batch_size=recipe.training.micro_batch_size,
        per_device_eval_batch_size=recipe.training.micro_batch_size,
        gradient_accumulation_steps=recipe.training.gradient_accumulation_steps,
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
        # transformers checkpoints no optimizer state of a model it sharded at load (fsdp with tp): weights only
        save_only_model=loads_sharded(recipe),
        eval_strategy=("steps" if training.eval_steps else "epoch") if evaluate else "no",
        eval_steps=training.eval_steps,
        seed=training.seed,
        data_seed=training.seed,
        bf16=mem.mixed_precision == "bf16",
        fp16=mem.mixed_precision == "fp16",
        **checkpointing_arguments(arguments_class, mem.gradient_checkpointing, mem.activation_offloading),
        optim=recipe.training.optimizer,
        torch_compile=mem.torch_compile,
        include_num_input_tokens_seen="non_padding",
        use_cpu=not recipe.uses_gpu,
        deepspeed=str(run_dir / DEEPSPEED_CONFIG) if mem.distributed == "deepspeed" else None,
        **tracker_arguments(TrainingArguments, recipe, run_dir),
        remove_unused_columns=False,
        # a stream is read by every rank, each keeping its own batches (or its own files, when the stream has as many):
        # dispatched from rank 0 instead, Accelerate concatenates the ranks' batches, which padding leaves uneven
        accelerator_config={"dispatch_batches": False} if recipe.data.streaming else None,
        disable_tqdm=True,
        logging_first_step=True,
    )
    return arguments_class(**{**common, **objective})


def build_model(recipe: Recipe, path: str | None = None):
    """The model to train (from ``path`` when given, else what model.id names): loaded, adapted for lora/qlora, its
    trainable share logged; and whether to use Liger."""
    from tuner.loading.model import choose_liger, count_parameters, load_model, trainable_model
    from tuner.train.parallelism import loading_arguments

    model = load_model(recipe, path, **loading_arguments(recipe))
    model.config.use_cache = False  # no KV cache in training; packing's per-sample masks need it off too
    liger, reason = choose_liger(recipe.memory.liger, model.config.model_type, recipe.uses_gpu)
    log.info("liger kernels: %s", reason)
    model = trainable_model(model, recipe)
    if recipe.memory.chunked_loss:
        from tuner.loading.chunked_loss import enable_chunked_loss

        enable_chunked_loss(model)
        log.info("loss: chunked linear cross-entropy (the tokens x vocabulary logits are never built whole)")
    trainable, total = count_parameters(model)
    log.info("trainable parameters: %d of %d (%.2f%%)", trainable, total, 100 * trainable / max(total, 1))
    return model, liger


def planned_gib(recipe: Recipe) -> float | None:
    """The planner's peak for the training device (a GPU, or the process's CPU RAM), or None where it cannot plan."""
    from tuner.planner import plan

    try:
        return float(plan(recipe).devices[0].total_gib)
    except Exception as exc:  # the run is done; a planner gap must not fail it
        log.warning("the planner could not plan this recipe: %s", exc)
        return None


def memory_report(recipe: Recipe, per_rank: dict[str, list[float]]) -> dict:
    """Measured peak memory next to the plan's prediction, with the line printed at the end of a run."""
    from tuner.train.callbacks import memory_fields

    on_gpu = "peak_reserved_gib" in per_rank
    measured = max(per_rank["peak_reserved_gib" if on_gpu else "peak_rss_gib"])
    predicted = planned_gib(recipe)
    where = "per GPU" if on_gpu else "of CPU RAM"
    what = "peak reserved on the busiest GPU" if on_gpu else "peak RSS of the training process"
    plan_part = f"plan predicted {predicted:.2f} GiB {where}" if predicted is not None else "no plan available"
    return {"predicted_gib": predicted, "measured_gib": measured, "measured": what, **memory_fields(per_rank),
            "line": f"{plan_part}, measured {measured:.2f} GiB ({what})"}


def same_machines(args, events: Path) -> None:
    """Right after the rendezvous, before the model loads: every machine runs the same libraries and GPU count
    (tuner.preflight), or every rank stops naming the difference; rank 0 records which machines joined."""
    from tuner.preflight import check_same_machines

    args.device  # joins the process group (Accelerate's state, as the Trainer would a moment later)
    fingerprints = check_same_machines()
    if args.process_index == 0:
        machines = {each["machine_rank"]: each for each in fingerprints}
        write_event(events, Machines(machines=[machines[rank] for rank in sorted(machines)]))


def train(recipe: Recipe, run_dir: Path, profile_steps: int = 0) -> int:
    from transformers import Trainer, set_seed

    from tuner.data.prepare import data_collator
    from tuner.data.prepared import prepare_data
    from tuner.fileio import atomic_write_text, umask_permissions
    from tuner.rundir.checkpoints import resume_checkpoint
    from tuner.loading.hub_download import run_snapshot
    from tuner.data.images import image_collator
    from tuner.loading.model import is_image_text, load_processor, load_tokenizer
    from tuner.rundir.layout import LOCK_FILE
    from tuner.train.callbacks import EventsCallback, ProfilerCallback, memory_per_rank
    from tuner.train.checkpoints import CheckpointInfoCallback
    from tuner.train.probe import ProbeCallback, probe_request, worst_case_data
    from tuner.train.rank_trace import RankTrace, tracing_ranks
    from tuner.train.trackers import configure_trackers

    events = run_dir / EVENTS_FILE
    lock_text = (run_dir / LOCK_FILE).read_text(encoding="utf-8")
    # everything a user can fix is checked before the model is built: resume settings, then the data
    resume = resume_checkpoint(recipe, run_dir, int(os.environ.get("WORLD_SIZE", 1)))
    configure_trackers(recipe, run_dir)
    if recipe.memory.distributed == "deepspeed" and not recipe.uses_gpu:
        from tuner.train.deepspeed_cpu import init_cpu_deepspeed

        init_cpu_deepspeed()  # before the arguments: they set up Accelerate's state, which starts DeepSpeed's too
    # before the model: under ZeRO-3 the arguments' DeepSpeed config makes from_pretrained shard while loading
    args = training_arguments(recipe, run_dir)
    if recipe.hardware.machines > 1:
        same_machines(args, events)
    snapshot = run_snapshot(run_dir)  # a hub model prepare_run downloaded: this machine's cached copy of that commit
    model_path = str(snapshot) if snapshot else None
    tokenizer = load_tokenizer(recipe, model_path)
    callbacks = [CheckpointInfoCallback(recipe, lock_text), EventsCallback(events, recipe.parallelism.model_parallel)]
    if profile_steps:
        callbacks.append(ProfilerCallback(run_dir / PROFILE_DIR, profile_steps))
    probe = probe_request(run_dir)  # `tuner probe`: worst-case batches, each phase measured, nothing kept
    if probe is not None:
        callbacks.append(ProbeCallback(events, recipe))
    # every weight a run creates (a new head, LoRA's A matrices) starts from training.seed: the Trainer seeds only
    # after the model is built, which leaves them to whatever drew from torch's generator before
    set_seed(recipe.training.seed)
    if recipe.objective.preference:
        from tuner.train.preference import preference_trainer

        trainer, data = preference_trainer(recipe, args, tokenizer, callbacks, model_path)
    elif recipe.objective.kind == "grpo":
        from tuner.train.grpo import grpo_trainer

        trainer, data = grpo_trainer(recipe, args, tokenizer, callbacks, model_path)
    elif recipe.objective.kind == "reward":
        from tuner.train.reward_model import reward_trainer

        trainer, data = reward_trainer(recipe, args, tokenizer, callbacks, model_path)
    elif recipe.objective.kind == "distill":
        from tuner.train.distill import distill_trainer

        trainer, data = distill_trainer(recipe, args, tokenizer, callbacks, model_path)
    else:
        data = prepare_data(recipe, tokenizer)
        if probe is not None:
            data = worst_case_data(data, recipe, probe["steps"])
        if recipe.parallelism.tp > 1 and data.eval is not None:
            from tuner.train.parallelism import whole_eval_batch

            args.per_device_eval_batch_size = whole_eval_batch(recipe.training.micro_batch_size, len(data.eval))
            log.info("tensor parallel: evaluating %d held-out samples in batches of %d (equal batches keep every "
                     "rank's copy the same weight)", len(data.eval), args.per_device_eval_batch_size)
        model, args.use_liger_kernel = build_model(recipe, model_path)  # the Trainer patches the kernels in at start
        collator, processing = data_collator(recipe, tokenizer), tokenizer
        if is_image_text(model.config.to_dict()):  # its processor makes the batches of images and is saved with it
            processing = load_processor(recipe, model_path)
            collator = image_collator(recipe, processing, data.data_format) or collator
        trace = RankTrace(events, collator) if tracing_ranks() else None
        from tuner.train.parallelism import loads_sharded, sharded_trainer_class

        trainer = (sharded_trainer_class() if loads_sharded(recipe) else Trainer)(
            model=model,
            args=args,
            train_dataset=data.train,
            eval_dataset=data.eval,
            data_collator=trace.collate if trace else collator,
            processing_class=processing,
            callbacks=callbacks + ([trace] if trace else []),
        )
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    if probe is not None:
        return 0  # measured; a probe's model is never the trained one
    final = run_dir / FINAL_DIR
    trainer.model.config.use_cache = True  # saved for inference
    trainer.save_model(str(final))
    metrics = dict(result.metrics)
    if "num_input_tokens_seen" in metrics:  # the Trainer counts a batch once per rank that shares it
        metrics["num_input_tokens_seen"] //= recipe.parallelism.model_parallel
    last_eval = next((entry for entry in reversed(trainer.state.log_history) if "eval_loss" in entry), None)
    if data.eval is not None and (last_eval is None or last_eval.get("step") != trainer.state.global_step):
        last_eval = trainer.evaluate()  # every rank: evaluation is a collective
    metrics.update({key: value for key, value in (last_eval or {}).items() if key.startswith("eval_")})
    per_rank = memory_per_rank()  # every rank: a gather, the run's last collective
    # then Accelerate's own end (trackers finished, the process group destroyed) while every rank is still here
    trainer.accelerator.end_training()
    if not trainer.is_world_process_zero():
        return 0
    report = memory_report(recipe, per_rank)  # planned on rank 0 only: the other ranks have no use for it
    atomic_write_text(final / LOCK_FILE, lock_text)
    umask_permissions(final)  # safetensors leaves its files 0600
    merged = None
    if recipe.method.kind != "full" and recipe.output.save in ("merged", "full"):
        from tuner.loading.merge import merge_adapter

        merged = merge_adapter(recipe, final, run_dir / MERGED_DIR, force=True)
    atomic_write_text(run_dir / MEMORY_REPORT, json.dumps(report, indent=2) + "\n")
    log.info("%s", report["line"])
    write_event(events, Memory.of(report))
    write_event(events, Finished(step=trainer.state.global_step, final_dir=str(final),
                                 merged_dir=str(merged) if merged else None, truncated=data.truncated,
                                 dropped=data.dropped,
                                 extra={k: v for k, v in metrics.items() if isinstance(v, (int, float))}))
    return 0


def main(argv: list[str] | None = None) -> int:
    from tuner.build_once import BuildTimeout
    from tuner.data.sources import DataError
    from tuner.loading.model import ModelLoadError
    from tuner.train.rewards import RewardError
    from tuner.train.supervision import watch_supervisor

    parser = argparse.ArgumentParser(prog="python -m tuner.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lock", help="the run directory's recipe.lock.yaml")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="record a torch profiler trace (and a CUDA memory snapshot on GPU) of the first N steps "
                             f"in <run dir>/{PROFILE_DIR}/")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[tuner] %(message)s")
    watch_supervisor()  # this rank stops if the tuner run that launched it dies
    lock = Path(args.lock)
    events = lock.parent / EVENTS_FILE
    recipe = None
    try:
        recipe = load_recipe(lock)
        if not recipe.uses_bitsandbytes:  # peft imports it anyway; its missing-kernel notes concern no one here
            logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
        return train(recipe, lock.parent, args.profile)
    except (RecipeError, CheckpointRefused, DataError, ModelLoadError, RewardError, BuildTimeout) as exc:
        bad_input = not isinstance(exc, BuildTimeout)  # a cache another process holds: the machine's problem
        write_event(events, Error(message=str(exc), rank=int(os.environ.get("RANK", 0)),
                                  error_kind=BAD_INPUT if bad_input else None))
        print(f"error: {terminal_text(str(exc))}", file=sys.stderr)
        return 2 if bad_input else 1
    except Exception as exc:
        from tuner.disk_messages import disk_full, disk_full_message
        from tuner.train.oom import EXIT_OUT_OF_MEMORY, exhausted_memory, is_out_of_memory, out_of_memory_advice

        if disk_full(exc):  # a checkpoint save, in torch's or safetensors' words ("unexpected pos ...")
            message = disk_full_message(lock.parent, exc)
            try:
                write_event(events, Error(message=message, rank=int(os.environ.get("RANK", 0)), error_kind=DISK_FULL))
            except OSError:
                pass  # the event file is on the same full disk: stderr says it
            print(f"error: {message}", file=sys.stderr)
            return 1

        if recipe is not None and is_out_of_memory(exc):  # answered with the advisor's next rung, not a stack
            rung, message = out_of_memory_advice(recipe, str(lock), exhausted_memory(exc))
            write_event(events, Error(message=message, rank=int(os.environ.get("RANK", 0)), error_kind="out_of_memory",
                                      next_rung=rung))
            print(f"error: {message}", file=sys.stderr)
            return EXIT_OUT_OF_MEMORY
        write_event(events, Error(message=f"{type(exc).__name__}: {exc}", rank=int(os.environ.get("RANK", 0))))
        raise


def run_rank() -> NoReturn:
    """:func:`main` on one rank of a launched world, under torch elastic's ``@record`` (as torchtitan and torchtune
    run theirs); the rank then leaves without the interpreter's teardown (:func:`leave`)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        code = record(main)()  # under torchrun, the traceback also goes to this rank's elastic error file
    except Exception:
        import traceback

        traceback.print_exc()
        code = 1
    leave(code, multi_rank=int(os.environ.get("WORLD_SIZE", "1")) > 1)


def leave(code: int, multi_rank: bool) -> NoReturn:
    """End this rank's process with ``code`` once its own work is done, skipping the interpreter's teardown.

    A rank that failed (its error event written) leaves at once: its peers wait in a collective that will never
    complete, and the teardown of the process group can wait with them (DeepSpeed #5005); leaving lets the launcher
    see the failure and stop every rank within its monitor interval.  A rank that succeeded first does what a normal
    exit does while Python is whole (joins its non-daemon threads, runs the ``atexit`` handlers: trackers, logging),
    then leaves the same way: during the teardown a C++ thread of torch's that takes the GIL is ended by Python
    (``pthread_exit``) from inside C++ code, which aborts the rank ("terminate called without an active exception",
    SIGABRT) after a run that finished; seen in CI on a DDP and a ZeRO-3 CPU rank, the process group destroyed.
    """
    if code == 0 or not multi_rank:
        import atexit
        import threading

        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_rank()
