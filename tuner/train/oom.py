"""Out of GPU memory mid-run: answer with the advisor's next rung as a change the user can make.

The planner's :func:`~tuner.planner.next_rung` names the rung; this module turns it into recipe
overrides (``--set`` lines) and one message, so the CLI, the TUI and the event stream say the same.
"""
from __future__ import annotations

from tuner.recipe.schema import Recipe

WHY = {
    "precompute_reference": "compute the reference log-probabilities before training instead of keeping a copy of the model",
    "zero1": "shard optimizer states across the GPUs (ZeRO-1)",
    "zero2": "shard optimizer states and gradients (ZeRO-2)",
    "micro_batch": "halve the micro-batch, doubling accumulation so the effective batch stays",
    "gradient_checkpointing": "recompute activations instead of storing them (~25% slower)",
    "zero3": "shard the parameters too (ZeRO-3)",
    "offload_optimizer": "keep optimizer states in CPU RAM",
    "offload_params": "keep parameters in CPU RAM between uses",
    "lora": "train LoRA adapters instead of every weight",
    "qlora": "quantise the frozen base to 4 bits (QLoRA)",
}

RESUMABLE = {"precompute_reference", "micro_batch", "gradient_checkpointing"}
EXIT_OUT_OF_MEMORY = 3


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, or the RuntimeError some kernels (and DeepSpeed) raise for the same thing."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def rung_overrides(recipe: Recipe, rung: str) -> list[str]:
    """The ``--set`` assignments that climb ``rung`` from ``recipe``."""
    mem = recipe.memory
    if rung == "precompute_reference":
        return ["objective.precompute_ref_log_probs=true"]
    if rung in ("zero1", "zero2", "zero3"):
        sets = ["memory.distributed=deepspeed", f"memory.zero_stage={rung[-1]}"]
        return sets + (["memory.optimizer=adamw_torch"] if "8bit" in mem.optimizer or "paged" in mem.optimizer else [])
    if rung == "micro_batch":
        return [f"memory.micro_batch_size={max(1, mem.micro_batch_size // 2)}",
                f"memory.gradient_accumulation_steps={mem.gradient_accumulation_steps * 2}"]
    if rung == "gradient_checkpointing":
        return ["memory.gradient_checkpointing=true"]
    if rung in ("offload_optimizer", "offload_params"):
        return [f"memory.{rung}=cpu"]
    if rung == "lora":
        return ["method.kind=lora"] + (["output.save=adapter"] if recipe.output.save == "full" else [])
    if rung == "qlora":
        return ["method.kind=qlora", "method.quantization.bits=4"]
    raise ValueError(f"unknown ladder rung {rung!r}")


def out_of_memory_advice(recipe: Recipe, recipe_path: str = "RECIPE") -> tuple[str | None, str]:
    """(rung or None, one paragraph) for a run that ran out of GPU memory."""
    from tuner.planner import next_rung

    rung = next_rung(recipe)
    if rung is None:
        return None, ("out of GPU memory, and every memory tactic this recipe allows is already in use: lower "
                      "memory.max_seq_length, use GPUs with more memory, or set method.allow_method_change: true "
                      f"to let tuner propose LoRA/QLoRA (tuner plan {recipe_path} --advise).")
    sets = " ".join(f"--set {assignment}" for assignment in rung_overrides(recipe, rung))
    # checkpoints survive a smaller micro-batch or recomputation; a new sharding or method changes their layout
    how = f"Continue with: tuner run {recipe_path} {sets} --resume" if rung in RESUMABLE else \
        f"Start again with: tuner run {recipe_path} {sets} --force"
    return rung, (f"out of GPU memory. Next step on the memory ladder: {WHY[rung]}. {how} "
                  f"(or see every option that fits: tuner plan {recipe_path} --advise).")
