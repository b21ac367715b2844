"""Out of GPU memory mid-run: answer with the advisor's next rung as a change the user can make.

The planner's :func:`~tuner.planner.next_step` names the rung, says why it helps and gives the recipe it
leads to with the ``--set`` lines that make it; this module only words them as one message, so the CLI,
the TUI and the event stream say the same and no second table maps rungs to recipe fields.
"""
from __future__ import annotations

from tuner.recipe.schema import Recipe
from tuner.recipe.tactics import KEEPS_CHECKPOINTS

EXIT_OUT_OF_MEMORY = 3
CPU_ALLOCATION_FAILED = "can't allocate memory"  # torch's CPU allocator, when the system refuses (RAM, a limit)


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, the RuntimeError some kernels (and DeepSpeed) raise for the same thing, or a CPU
    allocation the system refused (torch's CPU allocator, Python's MemoryError)."""
    import torch

    message = str(exc).lower()
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and ("out of memory" in message or CPU_ALLOCATION_FAILED in message))


def exhausted_memory(exc: BaseException) -> str:
    """What ran out: GPU memory (a CUDA allocation), or memory (the CPU's)."""
    import torch

    return "GPU memory" if isinstance(exc, torch.OutOfMemoryError) or "cuda" in str(exc).lower() else "memory"


def out_of_memory_advice(recipe: Recipe, recipe_path: str = "RECIPE", what: str = "GPU memory") -> tuple[str | None, str]:
    """(rung or None, one paragraph) for a run that ran out of ``what`` (GPU memory, or the CPU's memory)."""
    from tuner.planner import next_step

    step = next_step(recipe)
    if step is None:
        return None, (f"out of {what}, and every memory tactic this recipe allows is already in use: lower "
                      "training.max_seq_length, use GPUs with more memory, or set method.allow_method_change: true "
                      f"to let tuner propose LoRA/QLoRA (tuner plan {recipe_path} --advise).")
    sets = " ".join(f"--set {assignment}" for assignment in step.overrides)
    # checkpoints survive a smaller micro-batch or recomputation; a new sharding or method changes their layout
    how = f"Continue with: tuner run {recipe_path} {sets} --resume" if step.rung in KEEPS_CHECKPOINTS else \
        f"Start again with: tuner run {recipe_path} {sets} --force"
    return step.rung.value, (f"out of {what}. Next step on the memory ladder ({step.rung.value}): {step.reason}. "
                             f"{how} (or see every option that fits: tuner plan {recipe_path} --advise).")
