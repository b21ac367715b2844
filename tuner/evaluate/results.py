"""Results of ``tuner eval``: one JSON file per evaluation under the run (``eval/eval-<time>.json``, written whole or
not at all), the table printed (base beside fine-tuned with ``--baseline``), and the same scores sent to the
run's trackers (``training.report_to``)."""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from tuner.evaluate.harness import ModelResult
from tuner.rundir.layout import EVAL_DIR

EVAL_FILE = "eval-{stamp}.json"  # in EVAL_DIR; tuner/rundir/summary.py reads the newest


def write_results(run_dir: Path, results: list[ModelResult]) -> Path:
    """A new file under RUN/eval/, never one that is there already (two evaluations in one second: ``-2``)."""
    from tuner.fileio import create_exclusive_text

    (run_dir / EVAL_DIR).mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    document = {"written_by": "tuner eval", "time": time.time(), "models": [asdict(result) for result in results]}
    for attempt in range(1, 100):
        path = run_dir / EVAL_DIR / EVAL_FILE.format(stamp=stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            return create_exclusive_text(path, json.dumps(document, indent=2) + "\n")
        except FileExistsError:
            continue
    raise FileExistsError(f"{run_dir / EVAL_DIR}: 99 evaluations in one second already")


def result_table(results: list[ModelResult]):
    """A rich table: one row per task and metric, one column per model, and the change when there are two."""
    from rich.table import Table

    table = Table(title="evaluation")
    table.add_column("task")
    table.add_column("metric")
    for result in results:
        table.add_column(result.label, justify="right")
    if len(results) == 2:
        table.add_column("change", justify="right")
    rows = dict.fromkeys((task, metric) for result in results for task, scores in result.scores.items()
                         for metric in scores)
    for task, metric in rows:
        values = [result.scores.get(task, {}).get(metric) for result in results]
        cells = [f"{value:.4g}" if value is not None else "-" for value in values]
        if len(results) == 2:
            cells.append(f"{values[1] - values[0]:+.4g}" if None not in values else "-")
        table.add_row(task, metric, *cells)
    return table


def report_to_trackers(recipe, run_dir: Path, results: list[ModelResult]) -> list[str]:
    """Log the scores to each tracker the recipe trains with, where training wrote it (the same environment the
    Trainer's integrations had: tuner.train.trackers); returns a line per tracker written to."""
    from tuner.train.trackers import tracker_environment

    chosen = recipe.training.report_to
    if not chosen:
        return []
    import os

    os.environ.update(tracker_environment(recipe, run_dir))
    flat = {f"eval/{result.label}/{task}/{metric}": value for result in results
            for task, scores in result.scores.items() for metric, value in scores.items()}
    lines = []
    if "tensorboard" in chosen:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.environ["TENSORBOARD_LOGGING_DIR"])
        for key, value in flat.items():
            writer.add_scalar(key, value, 0)
        writer.close()
        lines.append(f"tensorboard: {os.environ['TENSORBOARD_LOGGING_DIR']}")
    if "mlflow" in chosen:
        import mlflow

        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", recipe.name))
        with mlflow.start_run(run_name=f"{recipe.name}-eval"):
            mlflow.log_metrics({key.replace("/", ".").replace(",", "_"): value for key, value in flat.items()})
        lines.append(f"mlflow: {mlflow.get_tracking_uri()}")
    skipped = [name for name in chosen if name not in ("tensorboard", "mlflow")]
    if skipped:
        lines.append(f"not sent to {', '.join(skipped)}: tuner eval writes to tensorboard and mlflow only")
    return lines
