"""gpu_check's results: the planner's prediction per cell, the CSV and markdown tables, the summary.

Pure (no torch): everything here runs on the CPU, so it is tested with recorded results and can
re-make the tables of a measured CSV (``gpu_check.py --report FILE``) when the planner changes.
The prediction is compared with the device's peak: ``torch.cuda.max_memory_reserved`` (what PyTorch's
allocator took, which is what runs out) plus the memory held outside the allocator (CUDA context, library
handles), measured as the device's used memory minus ``memory_reserved`` at the end of the cell.
"""
from __future__ import annotations

import csv
import io
import re
import statistics
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable

from benchmarks.gpu_matrix import Cell, build_recipe
from benchmarks.gpu_tactics import CLAIMS
from tuner.fileio import atomic_write_text

TOLERANCE_PCT = 10.0  # the bar: a prediction further off is a planner bug or a documented limitation
OK, OOM = "ok", "OOM"


@dataclass(frozen=True)
class Prediction:
    gib: float | None
    verdict: str
    fits: bool | None


@dataclass(frozen=True)
class Result:
    """One cell as measured (status ok, OOM, ``skipped: why``, ``error: what``) and as predicted."""

    cell: Cell
    gpu: str  # the device's own name, e.g. "NVIDIA H200"
    gpu_catalog: str | None  # its name in tuner.catalog.gpus, when it has one
    gpu_memory_gib: float
    software: str | None  # the versions that ran it: torch, transformers, accelerate, peft, bitsandbytes
    status: str
    params_b: float | None = None
    step_s: float | None = None
    tokens_per_s: float | None = None
    mfu_pct: float | None = None
    max_allocated_gib: float | None = None
    max_reserved_gib: float | None = None
    context_gib: float | None = None
    predicted_gib: float | None = None
    predicted_verdict: str | None = None
    predicted_fit: bool | None = None

    @property
    def device_peak_gib(self) -> float | None:
        """What the process held on the device at its peak: the allocator's peak plus the context."""
        if self.max_reserved_gib is None:
            return None
        return self.max_reserved_gib + (self.context_gib or 0.0)

    @property
    def error_gib(self) -> float | None:
        """Prediction minus measurement: positive over-estimates (safe), negative under-estimates."""
        if self.status != OK or self.predicted_gib is None or self.device_peak_gib is None:
            return None
        return self.predicted_gib - self.device_peak_gib

    @property
    def error_pct(self) -> float | None:
        error = self.error_gib
        return None if error is None or not self.device_peak_gib else 100 * error / self.device_peak_gib


# ---- predictions -------------------------------------------------------------------------------

def planner_prediction(recipe) -> Prediction:
    """The planner's peak for the one device and its verdict: the only code that knows the planner's API."""
    from tuner.planner import plan

    memory_plan = plan(recipe)
    return Prediction(memory_plan.devices[0].total_gib, memory_plan.verdict, memory_plan.fits)


def add_predictions(results: list[Result], predict: Callable = planner_prediction) -> tuple[list[Result], str | None]:
    """Each result with the prediction for its recipe, and a note when there are none (no planner yet)."""
    predicted = []
    for result in results:
        recipe = build_recipe(result.cell, result.gpu_catalog, result.gpu_memory_gib)
        try:
            prediction = predict(recipe)
        except ImportError as exc:
            return results, f"no predictions: the planner cannot be imported ({exc})"
        except Exception as exc:  # one recipe the planner rejects must not cost the other cells
            prediction = Prediction(None, f"error: {exc}", None)
        predicted.append(replace(result, predicted_gib=prediction.gib, predicted_verdict=prediction.verdict,
                                 predicted_fit=prediction.fits))
    return predicted, None


# ---- comparison --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Summary:
    cells: int
    ran: int
    oom: int
    compared: int
    median_abs_error_gib: float | None
    median_abs_error_pct: float | None
    worst_gib: tuple[str, float] | None  # (cell label, signed error) of the largest |error| in GiB
    worst_pct: tuple[str, float] | None  # likewise in percent of the measurement
    beyond_tolerance: tuple[str, ...]
    predicted_fit_but_oom: tuple[str, ...]
    predicted_oom_but_ran: tuple[str, ...]


def summarize(results: list[Result]) -> Summary:
    compared = [r for r in results if r.error_gib is not None]
    worst_gib = max(compared, key=lambda r: abs(r.error_gib), default=None)
    worst_pct = max(compared, key=lambda r: abs(r.error_pct), default=None)
    return Summary(
        cells=len(results),
        ran=sum(r.status == OK for r in results),
        oom=sum(r.status == OOM for r in results),
        compared=len(compared),
        median_abs_error_gib=statistics.median(abs(r.error_gib) for r in compared) if compared else None,
        median_abs_error_pct=statistics.median(abs(r.error_pct) for r in compared) if compared else None,
        worst_gib=(worst_gib.cell.label, worst_gib.error_gib) if worst_gib else None,
        worst_pct=(worst_pct.cell.label, worst_pct.error_pct) if worst_pct else None,
        beyond_tolerance=tuple(r.cell.label for r in compared if abs(r.error_pct) > TOLERANCE_PCT),
        predicted_fit_but_oom=tuple(r.cell.label for r in results if r.status == OOM and r.predicted_fit),
        predicted_oom_but_ran=tuple(r.cell.label for r in results if r.status == OK and r.predicted_fit is False),
    )


def summary_text(summary: Summary, note: str | None = None) -> str:
    not_measured = summary.cells - summary.ran - summary.oom
    lines = [f"{summary.cells} cells: {summary.ran} ran, {summary.oom} OOM, {not_measured} not measured"]
    if note:
        lines.append(note)
    if summary.compared:
        lines += [
            f"prediction vs device peak (max reserved + context) over {summary.compared} cells: median |error| "
            f"{summary.median_abs_error_gib:.2f} GiB ({summary.median_abs_error_pct:.1f}%)",
            f"worst in GiB: {summary.worst_gib[1]:+.2f} GiB ({summary.worst_gib[0]})",
            f"worst in %: {summary.worst_pct[1]:+.1f}% ({summary.worst_pct[0]})",
            _listing(f"off by more than {TOLERANCE_PCT:g}%", summary.beyond_tolerance),
        ]
    lines += [_listing("predicted to fit but OOM", summary.predicted_fit_but_oom),
              _listing("predicted not to fit but ran", summary.predicted_oom_but_ran)]
    return "\n".join(lines)


def baseline_text(results: list[Result]) -> str | None:
    """Tuner's tactics against plain transformers defaults, each pair measured side by side in this run, then the
    published claims users compare with (as claims); None for a run without baseline cells (rounds one to three)."""
    by_cell = {result.cell: result for result in results}
    lines = []
    for plain in (r for r in results if r.cell.tactic == "transformers-defaults"):
        twin = Cell(**{**plain.cell.__dict__, "tactic": "tuner-tactics", "gradient_checkpointing": True,
                       "attention": "auto"})
        tuned = by_cell.get(twin)
        name = twin.label.removesuffix(" tuner-tactics")
        if tuned is None or plain.status != OK or tuned.status != OK:
            lines.append(f"baseline {name}: tuner's tactics {tuned.status if tuned else 'absent'}, plain transformers "
                         f"{plain.status}")
            continue
        lines.append(f"baseline {name}: tuner's tactics {tuned.tokens_per_s:.0f} tokens/s, "
                     f"{tuned.device_peak_gib:.2f} GiB; plain transformers defaults {plain.tokens_per_s:.0f} tokens/s, "
                     f"{plain.device_peak_gib:.2f} GiB: {tuned.tokens_per_s / plain.tokens_per_s:.2f}x the speed at "
                     f"{tuned.device_peak_gib / plain.device_peak_gib:.2f}x the memory")
    if not lines:
        return None
    return "\n".join(lines + [f"claim, not measured here: {claim}" for claim in CLAIMS])


def _listing(title: str, labels: tuple[str, ...]) -> str:
    return f"{title}: " + (f"{len(labels)}: " + "; ".join(labels) if labels else "none")


# ---- files -------------------------------------------------------------------------------------

CELL_COLUMNS = [f.name for f in fields(Cell)]
RESULT_COLUMNS = [f.name for f in fields(Result) if f.name != "cell"]
DERIVED_COLUMNS = ["device_peak_gib", "error_gib", "error_pct"]
CSV_COLUMNS = CELL_COLUMNS + RESULT_COLUMNS + DERIVED_COLUMNS
_DECIMALS = {"step_s": 4, "tokens_per_s": 1, "mfu_pct": 2, "params_b": 3, "gpu_memory_gib": 2}


def _format(name: str, value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{_DECIMALS.get(name, 3)}f}"
    return str(value)


_TEXT = {"model", "method", "attention", "tactic", "gpu", "gpu_catalog", "software", "status", "predicted_verdict"}
_FLAGS = {"gradient_checkpointing", "predicted_fit"}
_COUNTS = {"seq_len", "micro_batch", "layers"}


def _parse(name: str, text: str):
    if text == "":
        return None
    if name in _TEXT:
        return text
    if name in _FLAGS:
        return text == "yes"
    return int(text) if name in _COUNTS else float(text)


def results_csv(results: list[Result]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for result in results:
        row = {name: getattr(result.cell, name) for name in CELL_COLUMNS}
        row |= {name: getattr(result, name) for name in RESULT_COLUMNS + DERIVED_COLUMNS}
        writer.writerow({name: _format(name, value) for name, value in row.items()})
    return buffer.getvalue()


def read_results(path: str | Path) -> list[Result]:
    """Results from a CSV that results_csv wrote (the derived columns are recomputed, not read)."""
    results = []
    with open(path, newline="", encoding="utf-8") as stream:
        for row in csv.DictReader(stream):
            # a column added after a CSV was written (round four's tactic, layers) takes the Cell's default
            cell = Cell(**{name: _parse(name, row[name]) for name in CELL_COLUMNS if name in row})
            values = {name: _parse(name, row[name]) for name in RESULT_COLUMNS}
            results.append(Result(cell=cell, **values))
    return results


MARKDOWN_HEADER = (
    "| model | method | ckpt | seq | attn | mb | tactic | status | alloc GiB | reserved GiB | device GiB | predicted GiB "
    "| error GiB | error % | plan verdict | tokens/s | MFU % |\n"
    "|---|---|---|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|\n"
)


def results_markdown(results: list[Result], title: str, summary: str) -> str:
    lines = [f"# {title}", "", "```", summary, "```", "", MARKDOWN_HEADER.rstrip("\n")]
    for r in results:
        cell = r.cell
        model = cell.model.rsplit("/", 1)[-1] + (f" ({cell.layers} layers)" if cell.layers else "")
        cells = [model, cell.method, _format("", cell.gradient_checkpointing),
                 str(cell.seq_len), cell.attention, str(cell.micro_batch), cell.tactic, r.status,
                 _number(r.max_allocated_gib, 2), _number(r.max_reserved_gib, 2), _number(r.device_peak_gib, 2),
                 _number(r.predicted_gib, 2),
                 _number(r.error_gib, 2, signed=True), _number(r.error_pct, 1, signed=True),
                 r.predicted_verdict or "", _number(r.tokens_per_s, 0), _number(r.mfu_pct, 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _number(value: float | None, decimals: int, signed: bool = False) -> str:
    if value is None:
        return ""
    return f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}"


def results_stem(date: str, gpu: str, quick: bool) -> str:
    """``gpu-check_2026-11-29_NVIDIA-H200`` (``_quick`` appended for --quick)."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", gpu).strip("-")
    return f"gpu-check_{date}_{slug}" + ("_quick" if quick else "")


def write_results(results: list[Result], directory: Path, stem: str, title: str, summary: str) -> tuple[Path, Path]:
    csv_path = atomic_write_text(directory / f"{stem}.csv", results_csv(results))
    md_path = atomic_write_text(directory / f"{stem}.md", results_markdown(results, title, summary))
    return csv_path, md_path
