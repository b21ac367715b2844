"""One evaluation: every task checked and its data loaded before the first model is, each model loaded by tuner
and scored on the same tasks, the results written under the run and sent to its trackers."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tuner.evaluate.harness import ModelResult, evaluate_model
from tuner.infer.target import InferenceTarget


@dataclass
class Evaluation:
    results: list[ModelResult]
    table: object
    saved: Path | None = None
    notes: list[str] = field(default_factory=list)


def evaluate(models: list[tuple[str, InferenceTarget]], names: list[str], include_path: str | None = None,
             held_out: bool = True, limit: int | None = None, batch_size: int = 16,
             max_memory: dict | None = None) -> Evaluation:
    """Score each (label, target) on the held-out task and the named harness tasks."""
    from tuner.evaluate.results import report_to_trackers, result_table, write_results
    from tuner.evaluate.tasks import held_out_task, load_named_tasks
    from tuner.infer.load import load_for_inference
    from tuner.loading.model import load_tokenizer

    last = models[-1][1]
    if names:
        load_named_tasks(names, include_path)  # refused (unknown, or data not here) before any model loads
    if held_out:  # checked (and its prompts rendered) with the evaluated model's tokenizer
        held_out_task(last.recipe, load_tokenizer(last.recipe, last.tokenizer_path), limit)
    results = []
    for label, target in models:
        loaded = load_for_inference(target, context=target.recipe.memory.max_seq_length, max_memory=max_memory)
        tasks = load_named_tasks(names, include_path) if names else []
        if held_out:
            tasks.append(held_out_task(target.recipe, loaded.tokenizer, limit))
        results.append(evaluate_model(loaded, label, tasks, batch_size))
        del loaded
    evaluation = Evaluation(results, result_table(results))
    if last.run_dir is not None:
        evaluation.saved = write_results(last.run_dir, results)
        evaluation.notes.append(f"results saved in {evaluation.saved}")
        evaluation.notes += report_to_trackers(last.recipe, last.run_dir, results)
    return evaluation
