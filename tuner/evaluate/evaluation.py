"""One evaluation: every task checked and its data loaded before the first model is, each model loaded by tuner
and scored on the same tasks, the results written under the run and sent to its trackers.  ``tuner demo`` scores
its model before and after training through the same two steps (:func:`score_model`, :func:`save_results`)."""
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


def score_model(label: str, target: InferenceTarget, names: list[str] = (), include_path: str | None = None,
                held_out: bool = True, limit: int | None = None, batch_size: int = 16,
                max_memory: dict | None = None) -> ModelResult:
    """Load ``target`` as tuner infers with it and score it on the named harness tasks and the held-out task."""
    from tuner.evaluate.tasks import held_out_task, load_named_tasks
    from tuner.infer.load import load_for_inference

    loaded = load_for_inference(target, context=target.recipe.training.max_seq_length, max_memory=max_memory)
    if held_out and loaded.processor is not None and not names:
        from tuner.data.held_out import held_out_samples
        from tuner.data.images import is_image_format

        samples, data_format = held_out_samples(target.recipe)
        if is_image_format(data_format):
            return image_held_out(loaded, label, samples[:limit], data_format)
    tasks = load_named_tasks(list(names), include_path) if names else []
    if held_out:
        tasks.append(held_out_task(target.recipe, loaded.tokenizer, limit))
    return evaluate_model(loaded, label, tasks, batch_size)


def image_held_out(loaded, label: str, samples: list[dict], data_format: str) -> ModelResult:
    """Exact match of an image-text model's greedy answers on the held-out image rows (lm-eval's harness takes text
    prompts only), each row's images read within the data's bounds as training read them."""
    from tuner.data.images import conversation, data_folder
    from tuner.evaluate.harness import SHOWN
    from tuner.evaluate.tasks import EXACT_MATCH, HELD_OUT_TASK
    from tuner.infer.images import image_answers

    recipe = loaded.target.recipe
    base = data_folder(recipe.data.source)
    rows = [conversation(sample, data_format, base, recipe.data.max_image_pixels) for sample in samples]
    expected = [completion[-1]["content"] for _, completion, _ in rows]
    longest = max(len(loaded.tokenizer(answer)["input_ids"]) for answer in expected)
    answers = [answer.strip() for answer in image_answers(loaded.model, loaded.processor,
                                                         [(prompt, images) for prompt, _, images in rows], longest + 4)]
    shown = [sample["image"] if isinstance(sample.get("image"), str) else prompt[-1]["content"][-1].get("text", "")
             if isinstance(prompt[-1]["content"], list) else prompt[-1]["content"] for sample, (prompt, _, _) in
             zip(samples, rows)]
    score = sum(a == e for a, e in zip(answers, expected)) / len(rows)
    return ModelResult(label, loaded.target.describe(), {HELD_OUT_TASK: {EXACT_MATCH: score}},
                       list(zip(shown, expected, answers))[:SHOWN])


def save_results(evaluated: InferenceTarget, results: list[ModelResult]) -> tuple[Path, list[str]]:
    """Write the results under the evaluated run and send them to its trackers: (the file, a line per note)."""
    from tuner.evaluate.results import report_to_trackers, write_results

    saved = write_results(evaluated.run_dir, results)
    return saved, [f"results saved in {saved}", *report_to_trackers(evaluated.recipe, evaluated.run_dir, results)]


def evaluate(models: list[tuple[str, InferenceTarget]], names: list[str], include_path: str | None = None,
             held_out: bool = True, limit: int | None = None, batch_size: int = 16,
             max_memory: dict | None = None) -> Evaluation:
    """Score each (label, target) on the held-out task and the named harness tasks."""
    from tuner.evaluate.results import result_table
    from tuner.evaluate.tasks import held_out_task, load_named_tasks
    from tuner.loading.model import load_tokenizer

    last = models[-1][1]
    if names:
        load_named_tasks(names, include_path)  # refused (unknown, or data not here) before any model loads
    if held_out:  # checked (and its prompts rendered) with the evaluated model's tokenizer
        held_out_task(last.recipe, load_tokenizer(last.recipe, last.tokenizer_path), limit)
    results = [score_model(label, target, names, include_path, held_out, limit, batch_size, max_memory)
               for label, target in models]
    evaluation = Evaluation(results, result_table(results))
    if last.run_dir is not None:
        evaluation.saved, evaluation.notes = save_results(last, results)
    return evaluation
