"""Trainer callback that writes the run's event stream (rank 0) with speed and memory."""
from __future__ import annotations

import os
import time
from pathlib import Path

from transformers import TrainerCallback

from tuner.events import write_event


def _memory_gib() -> dict[str, float]:
    """Peak memory of this process: CUDA allocated/reserved on GPU, resident set size on CPU."""
    import torch

    if torch.cuda.is_available():
        return {
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3),
        }
    import resource

    return {"peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


class EventsCallback(TrainerCallback):
    def __init__(self, events_path: Path, tokens_per_step: int):
        self.path = events_path
        self.tokens_per_step = tokens_per_step
        self._start = time.monotonic()

    def _on_main(self, state) -> bool:
        return state.is_world_process_zero

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.monotonic()
        self._first_step = state.global_step
        if self._on_main(state):
            write_event(self.path, "started", max_steps=state.max_steps, world_size=args.world_size,
                        resumed_from_step=state.global_step, pid=os.getpid())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._on_main(state) or not logs:
            return
        elapsed = max(time.monotonic() - self._start, 1e-9)
        done = max(state.global_step - self._first_step, 0)
        speed = {}
        if done:
            seconds_per_step = elapsed / done
            speed = {
                "tokens_per_s": round(self.tokens_per_step * args.world_size / seconds_per_step, 1),
                "samples_per_s": round(args.per_device_train_batch_size * args.gradient_accumulation_steps
                                       * args.world_size / seconds_per_step, 2),
                "eta_s": round(seconds_per_step * max(state.max_steps - state.global_step, 0), 1),
            }
        kind = "eval" if any(key.startswith("eval_") for key in logs) else "step"
        values = {key: (round(value, 6) if isinstance(value, float) else value) for key, value in logs.items()}
        write_event(self.path, kind, step=state.global_step, max_steps=state.max_steps, **values, **speed, **_memory_gib())

    def on_save(self, args, state, control, **kwargs):
        if self._on_main(state):
            write_event(self.path, "checkpoint", step=state.global_step,
                        path=str(Path(args.output_dir) / f"checkpoint-{state.global_step}"))
