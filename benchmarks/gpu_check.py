"""Measure peak GPU memory and speed of real training steps next to tuner's planner prediction.

    bash benchmarks/gpu_check.sh [--quick]        # one NVIDIA GPU, no network; <= 9 min (--quick: < 4 min)
    bash benchmarks/gpu_check.sh --round 3        # November's 90-cell grid (6 min; --quick 2 min)
    bash benchmarks/gpu_check.sh --report FILE    # re-make FILE's predictions, tables and summary (no GPU)

Models are built from their architecture with random weights (nothing is downloaded) and trained
for a few optimizer steps through tuner's own builders (tuner.loading.model, the Trainer arguments of
tuner.train) on synthetic tokens, one cell of benchmarks/gpu_matrix.py at a time; round four's tactic cells
(benchmarks/gpu_tactics.py, which names the cells held out of any planner change) run through
benchmarks/gpu_cells.py, and a cell whose package is not importable is recorded as skipped with the reason
(`--cpu-smoke` runs eleven tiny cells of the same code on the CPU: plumbing only, nothing measured). Results go to
benchmarks/results/gpu-check_<date>_<gpu>.csv and .md (see benchmarks/results/README.md).

`tuner probe` (the recipe's own launch, measured per phase) reads the same CUDA statistics through the real launch
path: on the GPU machine also run `python -m pytest tests/test_probe_gpu.py` (skipped without CUDA) and
`bash benchmarks/gpu_smoke.sh`, whose last step probes the demo and keeps its probe.json.

What it imports: torch with CUDA, transformers, accelerate, peft, pydantic and PyYAML (tuner's recipe);
for round four's cells, each recorded as skipped without its package: bitsandbytes (QLoRA), deepspeed (ZeRO-3),
trl and datasets (DPO, GRPO), liger-kernel, flash-attn and vllm. Never textual. To bring a missing package to a machine without network, download its wheels
where pip works (add the package's own dependencies: pydantic needs pydantic-core, annotated-types,
typing-inspection and typing-extensions >= 4.16 for pydantic 2.14):

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 -d wheels \
        pydantic pydantic-core annotated-types typing-inspection typing-extensions bitsandbytes \
        trl datasets liger-kernel   # and their own dependencies; deepspeed ships no wheel (pip builds it)

copy wheels/ over, then there: python3 -m pip install --no-index --no-deps --target /tmp/site wheels/*.whl
and export PYTHONPATH=/tmp/site before running.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu_cells import (OBJECTIVES, apply_tactic, build_model, collator, needs_own_model, objective_trainer,
                                  one_rank, undo_tactics, unrunnable)
from benchmarks.gpu_matrix import CPU_SMOKE, ROUNDS, STEPS, Cell, build_recipe, catalog_gpu, cell_params_b
from benchmarks.gpu_report import (OK, OOM, Result, add_predictions, baseline_text, read_results, results_stem,
                                   summarize, summary_text, write_results)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REQUIRED = {"transformers": "transformers", "accelerate": "accelerate", "peft": "peft",
            "pydantic": "pydantic", "yaml": "PyYAML"}  # module -> package to install
BUDGET_S = {False: 480.0, True: 200.0}  # by --quick: stop starting cells after this many seconds (9 and 4 min runs)
GIB = 2**30


class Refusal(Exception):
    """This machine cannot measure; the message says why and what to do."""


@dataclass(frozen=True)
class Gpu:
    name: str
    catalog: str | None
    memory_gib: float
    peak_bf16_tflops: float | None
    software: str


def check_machine() -> Gpu:
    """The GPU to measure on, or Refusal: no torch, no CUDA, or a package the measurement needs is missing."""
    if importlib.util.find_spec("torch") is None:
        raise Refusal("gpu_check needs PyTorch with CUDA, and torch is not installed here.")
    import torch

    if not torch.cuda.is_available():
        raise Refusal(f"gpu_check measures on an NVIDIA GPU, and torch {torch.__version__} finds no CUDA device here. "
                      "Run it on a machine with one; `--report FILE` re-makes the tables of a measured CSV without a GPU.")
    missing = [package for module, package in REQUIRED.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise Refusal(f"gpu_check needs {', '.join(missing)}: install it, or bring its wheels as the docstring of "
                      "benchmarks/gpu_check.py says.")
    name = torch.cuda.get_device_name(0)
    memory_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    spec = catalog_gpu(name, memory_gib)
    return Gpu(name, spec.name if spec else None, memory_gib, spec.peak_bf16_tflops if spec else None, versions())


# ---- one cell ----------------------------------------------------------------------------------

def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():  # not under --cpu-smoke
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def synchronize() -> None:
    """Wait for the GPU's queued work, so a timer counts it (nothing to wait for under --cpu-smoke)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def device_peaks() -> dict:
    """The allocator's peaks and the memory held outside it (CUDA context, library handles), in GiB."""
    import torch

    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return dict(max_allocated_gib=torch.cuda.max_memory_allocated() / GIB,
                max_reserved_gib=torch.cuda.max_memory_reserved() / GIB,
                context_gib=(total - free - torch.cuda.memory_reserved()) / GIB)


def synthetic_samples(cell: Cell, vocab_size: int) -> list[dict]:
    import torch

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab_size, (cell.micro_batch * STEPS, cell.seq_len), generator=generator)
    return [{"input_ids": row, "labels": row} for row in tokens]


def step_timer():
    """A Trainer callback timing each optimizer step (synchronised, so GPU work is counted)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            synchronize()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize()
            self.seconds.append(time.perf_counter() - self.started)

    return StepTimer()


def run_cell(base, cell: Cell, gpu: Gpu, params: int, workdir: Path):
    """Train ``cell`` for STEPS steps on ``base``, and leave it as found for the next cell.

    As found: no adapters, no gradients (an OOM in the backward pass leaves some), no checkpointing, and
    no mixed-precision wrapper around ``forward`` (each Trainer's Accelerator adds one).
    """
    import torch
    from accelerate.utils import extract_model_from_parallel
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback

    from tuner.loading.model import choose_attention, trainable_model
    from tuner.train.__main__ import training_arguments

    recipe = build_recipe(cell, gpu.catalog, gpu.memory_gib)
    free_memory()
    base.set_attn_implementation(choose_attention(recipe.memory.attention, base.config.model_type)[0])
    if cell.method == "full":
        base.requires_grad_(True)
    measured = dict(cell=cell, gpu=gpu.name, gpu_catalog=gpu.catalog, gpu_memory_gib=gpu.memory_gib,
                    software=gpu.software, params_b=params / 1e9)
    model, timer, trainer = base, step_timer(), None
    with one_rank(recipe, workdir):  # ZeRO-3 and FSDP2: a one-process group, undone after
        try:
            if cell.method != "full" and cell.tactic not in OBJECTIVES:
                model = trainable_model(base, recipe)
            model, args = apply_tactic(model, cell, recipe, training_arguments(recipe, workdir))
            if cell.tactic in OBJECTIVES:
                trainer = objective_trainer(model, cell, recipe, args, [timer], STEPS)
                model = trainer.model  # TRL's adapters, unloaded below
            else:
                vocab_size = base.config.get_text_config().vocab_size
                trainer = Trainer(model=model, args=args, data_collator=collator(recipe),
                                  train_dataset=synthetic_samples(cell, vocab_size), callbacks=[timer])
            trainer.remove_callback(PrinterCallback)
            trainer.train()
            synchronize()
            step_s = statistics.median(timer.seconds[1:])
            tokens_per_s = cell.tokens_per_step / step_s
            active = params * cell_params_b(cell, active=True) / cell_params_b(cell)  # an MoE's routed share
            mfu = 100 * 6 * active * tokens_per_s / (gpu.peak_bf16_tflops * 1e12) if gpu.peak_bf16_tflops else None
            return Result(status=OK, step_s=step_s, tokens_per_s=tokens_per_s, mfu_pct=mfu, **device_peaks(), **measured)
        except torch.OutOfMemoryError:
            return Result(status=OOM, **measured)
        except Exception as exc:  # one broken cell must not cost the others; the traceback goes to the log
            traceback.print_exc()
            return Result(status=f"error: {type(exc).__name__}: {exc}".replace("\n", " ")[:200], **measured)
        finally:
            del trainer
            if not needs_own_model(cell):  # a model of its own is dropped, whatever its wrappers did to it
                extract_model_from_parallel(model, keep_fp32_wrapper=False)
                if model is not base:
                    model.unload()
                base.zero_grad(set_to_none=True)
                base.gradient_checkpointing_disable()
                undo_tactics(base)
            free_memory()


# ---- the matrix --------------------------------------------------------------------------------

class Run:
    """Measures cells model by model within a time budget, printing one line per cell."""

    def __init__(self, gpu: Gpu, deadline: float, started: float, workdir: Path):
        self.gpu, self.deadline, self.started, self.workdir = gpu, deadline, started, workdir
        self.results: list = []

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f}s] {message}", flush=True)

    def record(self, cell: Cell, status: str, params: int | None = None) -> None:
        self.results.append(Result(cell=cell, gpu=self.gpu.name, gpu_catalog=self.gpu.catalog,
                                   gpu_memory_gib=self.gpu.memory_gib, software=self.gpu.software, status=status,
                                   params_b=params / 1e9 if params else None))
        self.log(f"{cell.label}: {status}")

    def measure(self, cells: list[Cell]) -> list:
        runnable = []
        for cell in cells:
            if reason := unrunnable(cell):
                self.record(cell, reason)
            else:
                runnable.append(cell)
        groups = [[cell] for cell in runnable if needs_own_model(cell)]  # a model of its own, built and freed
        for shape in dict.fromkeys((cell.model, cell.layers) for cell in runnable if not needs_own_model(cell)):
            groups.append([cell for cell in runnable if (cell.model, cell.layers) == shape and not needs_own_model(cell)])
        groups.sort(key=lambda group: min(cells.index(cell) for cell in group))  # the matrix's order of importance
        for model_cells in groups:
            try:
                self.measure_model(model_cells)
            except Exception as exc:  # building or loading failed: the model's remaining cells say why
                traceback.print_exc()
                done = {result.cell for result in self.results}
                for cell in model_cells:
                    if cell not in done:
                        self.record(cell, f"error: {type(exc).__name__}: {exc}".replace("\n", " ")[:200])
            free_memory()
        return sorted(self.results, key=lambda result: cells.index(result.cell))

    def measure_model(self, cells: list[Cell]) -> None:
        from tuner.loading.model import load_model

        if time.monotonic() > self.deadline:
            for cell in cells:
                self.record(cell, "not run: time budget")
            return
        self.log(f"building {cells[0].label.split()[0]} with random weights")
        model = build_model(cells[0], build_recipe(cells[0], self.gpu.catalog, self.gpu.memory_gib))
        params = sum(p.numel() for p in model.parameters())
        self.run_cells(model, [c for c in cells if c.method != "qlora"], params)
        quantized = [c for c in cells if c.method == "qlora"]
        if not quantized:
            return
        if importlib.util.find_spec("bitsandbytes") is None:
            for cell in quantized:
                self.record(cell, "skipped: bitsandbytes is not installed", params)
            return
        if time.monotonic() > self.deadline:
            for cell in quantized:
                self.record(cell, "not run: time budget", params)
            return
        with tempfile.TemporaryDirectory(dir=self.workdir) as saved:  # QLoRA loads 4-bit through tuner's loader
            self.log("saving the random weights to load them back 4-bit")
            model.save_pretrained(saved)
            del model
            free_memory()
            model = load_model(build_recipe(quantized[0], self.gpu.catalog, self.gpu.memory_gib), path=saved)
        self.run_cells(model, quantized, params)

    def run_cells(self, model, cells: list[Cell], params: int) -> None:
        for cell in cells:
            if time.monotonic() > self.deadline:
                self.record(cell, "not run: time budget", params)
                continue
            began = time.monotonic()
            result = run_cell(model, cell, self.gpu, params, self.workdir)
            self.results.append(result)
            numbers = (f", {result.max_allocated_gib:.2f} GiB allocated, {result.max_reserved_gib:.2f} reserved, "
                       f"{result.context_gib:.2f} context, {result.tokens_per_s:.0f} tokens/s"
                       if result.max_reserved_gib is not None else "")
            self.log(f"{cell.label}: {result.status}{numbers} ({time.monotonic() - began:.1f}s)")


# ---- command line ------------------------------------------------------------------------------

def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("torch", "transformers", "accelerate", "peft", "bitsandbytes"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} missing")
    return ", ".join(found)


def free_stem(directory: Path, stem: str) -> str:
    """``stem``, or ``stem-2``, ``stem-3``... so a second run on the same day keeps the first one's files."""
    candidate, number = stem, 1
    while (directory / f"{candidate}.csv").exists() or (directory / f"{candidate}.md").exists():
        number += 1
        candidate = f"{stem}-{number}"
    return candidate


def report(results: list, directory: Path, stem: str, title: str, about: str) -> None:
    results, note = add_predictions(results)
    summary = summary_text(summarize(results), "\n".join(filter(None, [about, note, baseline_text(results)])))
    csv_path, md_path = write_results(results, directory, stem, title, summary)
    print(summary)
    print(f"wrote {csv_path} and {md_path}")


def measure_and_report(quick: bool, directory: Path, budget_s: float | None, round_number: int = 4) -> int:
    started = time.monotonic()
    gpu = check_machine()
    cells = ROUNDS[round_number][quick]()
    deadline = started + (budget_s if budget_s is not None else BUDGET_S[quick])
    print(f"gpu_check: {len(cells)} cells on {gpu.name} ({gpu.memory_gib:.1f} GiB, catalog: {gpu.catalog or 'none'}); "
          f"{gpu.software}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
        results = Run(gpu, deadline, started, Path(workdir)).measure(cells)
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    stem = free_stem(directory, results_stem(date, gpu.name, quick))
    title = f"gpu_check{' --quick' if quick else ''} on {gpu.name} ({gpu.memory_gib:.1f} GiB), {date}"
    report(results, directory, stem, title, f"{gpu.software}; {time.monotonic() - started:.0f} s in all")
    return 0


def cpu_smoke() -> int:
    """Round four's code paths on tiny CPU cells (gpu_matrix.CPU_SMOKE): proves the plumbing, measures nothing,
    writes nothing; exit code 1 when a cell is not ok."""
    started = time.monotonic()
    missing = [package for module, package in REQUIRED.items() if importlib.util.find_spec(module) is None]
    if missing or importlib.util.find_spec("torch") is None:
        raise Refusal(f"--cpu-smoke needs torch and {', '.join(REQUIRED.values())}: install what is missing.")
    cpu = Gpu("cpu (smoke)", None, 0.0, None, versions())
    with tempfile.TemporaryDirectory(prefix="gpu-check-smoke-") as workdir:
        results = Run(cpu, started + 600, started, Path(workdir)).measure(CPU_SMOKE)
    failed = [result.cell.label for result in results if result.status != OK]
    print(f"cpu smoke: {len(results) - len(failed)} of {len(results)} cells ok" + (f"; not ok: {'; '.join(failed)}"
                                                                                   if failed else ""))
    return 1 if failed else 0


def remake_report(path: Path, directory: Path) -> int:
    if not path.is_file():
        raise Refusal(f"--report {path}: no such file; give a CSV that gpu_check wrote (benchmarks/results/*.csv).")
    results = read_results(path)
    title = f"gpu_check on {results[0].gpu} ({results[0].gpu_memory_gib:.1f} GiB), from {path.name}" if results else path.name
    report(results, directory, path.stem, title, results[0].software if results else "")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a subset that runs in under 4 minutes (round 3: 2)")
    parser.add_argument("--round", type=int, choices=sorted(ROUNDS), default=4,
                        help="4: every tactic, MoE, objectives, image-text, baselines (default); 3: the 90-cell "
                        "method x checkpointing x seq x attention x micro-batch grid of November")
    parser.add_argument("--report", metavar="CSV", help="re-make a measured CSV's predictions, tables and summary; no GPU needed")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="run round four's code paths on a few tiny CPU cells (no GPU, nothing measured or written)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the CSV and markdown (default: %(default)s)")
    parser.add_argument("--budget-s", type=float, help="start no cell after this many seconds (default 480, --quick 200)")
    args = parser.parse_args(argv)
    try:
        if args.report:
            return remake_report(Path(args.report), args.out)
        if args.cpu_smoke:
            return cpu_smoke()
        return measure_and_report(args.quick, args.out, args.budget_s, args.round)
    except Refusal as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
