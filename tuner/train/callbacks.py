"""Trainer callbacks: the run's event stream with speed and measured memory, and the torch profiler."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from transformers import TrainerCallback

from tuner.rundir.events import CheckpointSaved, Eval, Started, Step, write_event
from tuner.fileio import atomic_write_text
from tuner.planner.items import GIB

log = logging.getLogger("tuner")



def memory_gib() -> dict[str, float]:
    """Peak memory of this process: CUDA allocated/reserved on GPU, resident set size on CPU."""
    import torch

    if torch.cuda.is_available():
        return {
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3),
        }
    import resource

    return {"peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 3)}


def memory_per_rank() -> dict[str, list[float]]:
    """:func:`memory_gib` of every rank, gathered to all ranks (every rank must call it at the same point)."""
    import torch.distributed as dist

    mine = memory_gib()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return {key: [value] for key, value in mine.items()}
    everyone: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, mine)
    return {key: [rank[key] for rank in everyone] for key in mine}


def memory_fields(per_rank: dict[str, list[float]]) -> dict:
    """Event fields: the peak over ranks under the plain name, and every rank's value beside it."""
    fields: dict = {}
    for key, values in per_rank.items():
        fields[key] = max(values)
        if len(values) > 1:
            fields[f"{key}_per_rank"] = values
    return fields


class EventsCallback(TrainerCallback):
    """Writes started/step/eval/checkpoint events (rank 0). Tokens/s counts real (non-padding) tokens.

    ``same_batch_ranks``: the ranks that compute one batch together (tp x cp x sp). The Trainer's token count adds
    up every rank's batch, so it counts a batch they share that many times; tokens/s and samples/s count it once."""

    def __init__(self, events_path: Path, same_batch_ranks: int = 1):
        self.path = events_path
        self.same_batch_ranks = same_batch_ranks
        self._start = time.monotonic()
        self._first_step = 0
        self._first_tokens = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.monotonic()
        self._first_step = state.global_step
        self._first_tokens = state.num_input_tokens_seen
        if state.is_world_process_zero:
            write_event(self.path, Started(max_steps=state.max_steps, world_size=args.world_size,
                                           resumed_from_step=state.global_step, pid=os.getpid()))

    def on_log(self, args, state, control, logs=None, **kwargs):
        memory = memory_fields(memory_per_rank())  # a collective: every rank takes part
        if not state.is_world_process_zero or not logs or "train_loss" in logs:
            return  # the end-of-training summary goes into the "finished" event
        elapsed = max(time.monotonic() - self._start, 1e-9)
        done = max(state.global_step - self._first_step, 0)
        speed = {}
        if done:
            seconds_per_step = elapsed / done
            speed = {
                "tokens_per_s": round((state.num_input_tokens_seen - self._first_tokens)
                                      / self.same_batch_ranks / elapsed, 1),
                "samples_per_s": round(args.per_device_train_batch_size * args.gradient_accumulation_steps
                                       * args.world_size / self.same_batch_ranks / seconds_per_step, 2),
                "eta_s": round(seconds_per_step * max(state.max_steps - state.global_step, 0), 1),
            }
        kind = Eval if any(key.startswith("eval_") for key in logs) else Step
        values = {key: (round(value, 6) if isinstance(value, float) else value) for key, value in logs.items()}
        write_event(self.path, kind(step=state.global_step, max_steps=state.max_steps,
                                    extra={**values, **speed, **memory}))

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            write_event(self.path, CheckpointSaved(
                step=state.global_step, path=str(Path(args.output_dir) / f"checkpoint-{state.global_step}")))


class ProfilerCallback(TrainerCallback):
    """Profiles the first ``steps`` optimizer steps with torch.profiler; on GPU also records a CUDA memory snapshot.

    Writes ``<directory>/trace.json`` (open in https://ui.perfetto.dev or chrome://tracing), ``ops.txt`` (the top
    operators by time and memory) and, on GPU, ``memory_snapshot.pickle`` (drag into https://pytorch.org/memory_viz).
    """

    def __init__(self, directory: Path, steps: int):
        self.directory = directory
        self.steps = steps
        self._profiler = None
        self._done = 0

    def on_train_begin(self, args, state, control, **kwargs):
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        self._profiler = profile(activities=activities, record_shapes=True, profile_memory=True, with_stack=False)
        self._profiler.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self._profiler is None:
            return
        self._profiler.step()
        self._done += 1
        if self._done >= self.steps:
            self._finish(state)

    def on_train_end(self, args, state, control, **kwargs):
        if self._profiler is not None:
            self._finish(state)

    def _finish(self, state) -> None:
        import torch

        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        rank = os.environ.get("RANK", "0")
        rank = f"-rank{rank}" if rank != "0" else ""
        self.directory.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(self.directory / f"trace{rank}.json"))
        sort = "self_cuda_memory_usage" if torch.cuda.is_available() else "self_cpu_memory_usage"
        table = profiler.key_averages().table(sort_by=sort, row_limit=40)
        atomic_write_text(self.directory / f"ops{rank}.txt", table)
        if torch.cuda.is_available():
            torch.cuda.memory._dump_snapshot(str(self.directory / f"memory_snapshot{rank}.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        log.info("profile of %d step(s) saved in %s", self._done, self.directory)
