"""The rank side of ``tuner probe``: train on worst-case batches and measure every phase on this rank.

A probe's run directory holds ``probe_request.json`` (written by :mod:`tuner.launch.probe` before it launches the
recipe's own world); the training entrypoint then replaces the prepared samples with worst-case ones — each
``max_seq_length`` tokens long, made of the longest real samples laid end to end and collated as the recipe
collates them (padded, or packed into one row) — and :class:`ProbeCallback` writes one ``probe`` event per rank
and phase: the peak memory since the phase began (CUDA allocated / reserved / device on a GPU; the peak resident
set on the CPU, reset between phases through ``/proc/self/clear_refs``) and the speed of the timed steps.  Before
each phase a rank writes a ``probe_phase`` event, so a rank that fails is named with the phase and batch it was in.
"""
from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

from transformers import TrainerCallback

from tuner.rundir.events import Probe, ProbePhase, write_event
from tuner.fileio import write_control_file
from tuner.planner.items import EVAL, GIB, LOAD, SAVE, TRAINING_STEP
from tuner.planner.measured import cpu_name
from tuner.recipe.schema import Recipe
from tuner.rundir.layout import PROBE_REQUEST

POOL_PER_SAMPLE = 4  # longest real samples kept per worst-case sample: enough to fill one, and varied


def probe_request(run_dir: Path) -> dict | None:
    """What the probe asked of this run directory, or None for a normal run."""
    path = Path(run_dir) / PROBE_REQUEST
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


# ---------------------------------------------------------------- memory of this process

def _status_kib(field: str) -> int | None:
    """A ``VmHWM``/``VmRSS`` line of /proc/self/status in KiB (None where there is no /proc)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Start a new resident-set peak (Linux: writing 5 to clear_refs sets VmHWM to the current RSS)."""
    try:
        write_control_file("/proc/self/clear_refs", "5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    kib = _status_kib("VmHWM")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_rss_bytes() -> int:
    kib = _status_kib("VmRSS")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class PhaseMeter:
    """Peak memory of this process since :meth:`reset`: CUDA allocator statistics on a GPU, the resident set always."""

    def __init__(self):
        import torch

        self.torch = torch
        self.gpu = torch.cuda.is_available()
        self.resets_rss = True

    def reset(self) -> None:
        self.resets_rss = reset_peak_rss()
        if self.gpu:
            self.torch.cuda.reset_peak_memory_stats()

    def device(self) -> tuple[str, float]:
        """(device name, its memory in GiB): this rank's GPU, or the machine's CPU and RAM."""
        if self.gpu:
            index = self.torch.cuda.current_device()
            return self.torch.cuda.get_device_name(index), self.torch.cuda.mem_get_info(index)[1] / GIB
        import psutil

        return cpu_name(), psutil.virtual_memory().total / GIB

    def peak(self) -> dict[str, float]:
        """The phase's peaks; on a GPU ``device_gib`` adds what the device holds outside the allocator now (CUDA
        context, NCCL, other processes: cudaMemGetInfo) to the reserved peak, as nvidia-smi would have shown it.
        ``address_space_gib`` is the process's virtual size now: what an address-space limit (``ulimit -v``, common
        on clusters) is held against."""
        values = {"peak_rss_gib": peak_rss_bytes() / GIB,
                  "address_space_gib": (_status_kib("VmSize") or 0) * 1024 / GIB}
        if self.gpu:
            cuda = self.torch.cuda
            free, total = cuda.mem_get_info()
            outside = max(total - free - cuda.memory_reserved(), 0)
            values.update(peak_allocated_gib=cuda.max_memory_allocated() / GIB,
                          peak_reserved_gib=cuda.max_memory_reserved() / GIB,
                          device_gib=(cuda.max_memory_reserved() + outside) / GIB, outside_allocator_gib=outside / GIB)
        return {key: round(value, 4) for key, value in values.items()}

    def current(self) -> float:
        """Memory held now: live CUDA tensors on a GPU; on the CPU the resident set once the C library has handed
        its freed heap back to the system (glibc's malloc_trim), so freed tensors do not count as held (GiB)."""
        if self.gpu:
            return round(self.torch.cuda.memory_allocated() / GIB, 4)
        trim_heap()
        return round(current_rss_bytes() / GIB, 4)


def trim_heap() -> None:
    """Return the freed heap to the system where the C library can (glibc); elsewhere nothing happens."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------- worst-case samples

def worst_case_samples(dataset, count: int, max_length: int):
    """``count`` samples of exactly ``max_length`` tokens (``input_ids`` and ``labels``), each made of the longest
    samples of ``dataset`` laid end to end and cut at ``max_length``: the batches the planner plans for."""
    import numpy as np
    import pyarrow.compute as pc
    from datasets import Dataset

    # through the dataset's own indices (a selection of a table is not the table)
    lengths = pc.list_value_length(dataset.with_format("arrow")["input_ids"]).to_numpy(zero_copy_only=False)
    longest = np.argsort(-lengths, kind="stable")[: max(count * POOL_PER_SAMPLE, 1)]
    pool = dataset.select(longest.tolist())
    ids_pool, labels_pool = pool["input_ids"], pool["labels"]
    samples = {"input_ids": [], "labels": []}
    cursor = 0
    for _ in range(count):
        ids: list[int] = []
        labels: list[int] = []
        while len(ids) < max_length:
            ids += ids_pool[cursor % len(pool)]
            labels += labels_pool[cursor % len(pool)]
            cursor += 1
        samples["input_ids"].append(ids[:max_length])
        samples["labels"].append(labels[:max_length])
    return Dataset.from_dict(samples)


def first_samples(stream, count: int):
    """The first ``count`` samples of a stream as a dataset (a stream has no length to sort by)."""
    from itertools import islice

    from datasets import Dataset

    rows = list(islice(iter(stream), count))
    return Dataset.from_dict({column: [row[column] for row in rows] for column in ("input_ids", "labels")})


def worst_case_data(data, recipe: Recipe, steps: int):
    """The prepared data with worst-case samples: enough for ``steps`` optimizer steps on every data-parallel rank,
    and one evaluation batch per rank when the recipe evaluates."""
    from dataclasses import replace

    from tuner.data.prepare import streamed

    per_step = recipe.training.micro_batch_size * recipe.training.gradient_accumulation_steps * recipe.data_parallel
    train = first_samples(data.train, 4 * per_step * steps) if streamed(data.train) else data.train
    probe_train = worst_case_samples(train, per_step * steps, recipe.training.max_seq_length)
    probe_eval = None
    if data.eval is not None:  # the largest evaluation batch: per_device_eval_batch_size is the micro-batch
        probe_eval = worst_case_samples(data.eval if len(data.eval) else train,
                                        recipe.training.micro_batch_size * recipe.data_parallel, recipe.training.max_seq_length)
    return replace(data, train=probe_train, eval=probe_eval)


def batch_description(recipe: Recipe, samples: int) -> dict:
    """The batch a phase runs, as the probe names it when a rank fails."""
    seq = recipe.training.max_seq_length
    if recipe.objective.kind != "sft":  # TRL tokenises its samples itself: the recipe's own, up to seq tokens
        return {"samples": samples, "tokens_per_sample": None, "packed": False,
                "text": f"{samples} {recipe.objective.kind} samples of up to {seq} tokens (the recipe's own)"}
    return {"samples": samples, "tokens_per_sample": seq, "packed": recipe.data.packing,
            "text": f"{samples} x {seq} tokens" + (f" packed into one row of {samples * seq}" if recipe.data.packing
                                                    else "")}


# ---------------------------------------------------------------- the callback

class ProbeCallback(TrainerCallback):
    """Writes each rank's ``probe_phase`` (starting) and ``probe`` (measured) events: loading (everything until
    training starts), the training step (every probe step; the steps after the first are timed), the evaluation
    and the checkpoint save that the probe recipe schedules at its last step."""

    def __init__(self, events_path: Path, recipe: Recipe):
        self.path = events_path
        self.recipe = recipe
        self.rank = int(os.environ.get("RANK", "0"))
        self.meter = PhaseMeter()
        self.device: tuple[str, float] | None = None  # known once the Trainer has placed this rank on its device
        self.phase = LOAD
        self._steps: list[tuple[float, int]] = []  # (time, tokens seen by every rank) at each step's end
        self._begin = time.monotonic()
        self._process_gib = round(current_rss_bytes() / GIB, 4)  # libraries imported; no data, no model yet
        self._start(LOAD, None)

    def _start(self, phase: str, samples: int | None) -> None:
        self.phase = phase
        batch = batch_description(self.recipe, samples) if samples else None
        write_event(self.path, ProbePhase(rank=self.rank, pid=os.getpid(), phase=phase, batch=batch))

    def _measured(self, phase: str, **extra) -> None:
        if self.device is None:
            self.device = self.meter.device()
        name, capacity = self.device
        write_event(self.path, Probe(rank=self.rank, pid=os.getpid(), phase=phase, device=name,
                                     capacity_gib=round(capacity, 3), resets_peak=self.meter.resets_rss,
                                     extra={**self.meter.peak(), **extra}))
        self.meter.reset()

    def on_train_begin(self, args, state, control, **kwargs):
        # the model, its wrappers and states in place; the process before data and model
        self._measured(LOAD, current_gib=self.meter.current(), baseline_rss_gib=self._process_gib)
        self._begin = time.monotonic()
        self._start(TRAINING_STEP, args.per_device_train_batch_size)

    def on_step_end(self, args, state, control, **kwargs):
        self._steps.append((time.monotonic(), state.num_input_tokens_seen))
        if state.global_step < state.max_steps:
            return
        between = self.meter.current()  # after the optimizer step and zero_grad: the model states
        self._measured(TRAINING_STEP, between_steps_gib=between, steps=len(self._steps), **self._speed(args))
        if control.should_evaluate:  # set by the Trainer's flow callback, which runs first
            self._start(EVAL, args.per_device_eval_batch_size)
        else:
            self._start(SAVE, None)

    def _speed(self, args) -> dict:
        """Tokens/s of the timed steps (every step after the first, which creates states and warms caches), counted
        once per batch: the ranks of one tensor/context-parallel group share theirs."""
        shared = self.recipe.parallelism.model_parallel
        if len(self._steps) >= 2:
            (t0, n0), (t1, n1) = self._steps[0], self._steps[-1]
            timed = len(self._steps) - 1
        else:
            (t0, n0), (t1, n1), timed = (self._begin, 0), self._steps[-1], 1
        seconds = max(t1 - t0, 1e-9)
        return {"tokens_per_s": round((n1 - n0) / shared / seconds, 1), "seconds_per_step": round(seconds / timed, 4),
                "timed_steps": timed}

    def on_evaluate(self, args, state, control, **kwargs):
        if self.phase == EVAL:
            self._measured(EVAL)
            self._start(SAVE, None)

    def on_save(self, args, state, control, **kwargs):
        if self.phase == SAVE:
            self._measured(SAVE)
            self.phase = "done"
