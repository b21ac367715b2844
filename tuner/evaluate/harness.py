"""Run the harness on a model tuner loaded: lm-eval's own HF adapter (``HFLM``) wraps the model and tokenizer as they
are, so adapters, dtype and device placement are tuner's (the harness loads nothing itself)."""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from tuner.reason import library_words

SHOWN = 5  # examples of the held-out task kept with the results


@dataclass
class ModelResult:
    """One model's scores: task -> metric -> value, and a few held-out examples (shown, expected, answer)."""

    label: str
    model: str
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    examples: list[tuple[str, str, str]] = field(default_factory=list)


def _metrics(task_results: dict) -> dict[str, float]:
    """The harness's "metric,filter" keys as metric names (stderr left out)."""
    out = {}
    for key, value in task_results.items():
        metric, _, _ = key.partition(",")
        if isinstance(value, (int, float)) and not metric.endswith("_stderr") and metric not in ("alias", "samples", "sample_len"):
            out[metric] = float(value)
    return out


def harness_failure(exc: Exception, tasks: list) -> Exception:
    """What the harness raised while scoring, as one message naming the tasks (a task's settings, e.g. a
    ``max_gen_toks`` the model's length cannot hold, fail deep inside it); out of memory, a full disk and
    interruptions stay what they are."""
    from tuner.data.sources import DataError
    from tuner.disk_messages import disk_full
    from tuner.train.oom import is_out_of_memory

    if disk_full(exc) or is_out_of_memory(exc):
        return exc
    names = ", ".join(sorted({str(task.get("task") if isinstance(task, dict) else
                                  getattr(getattr(task, "config", None), "task", None) or type(task).__name__)
                              for task in tasks}))
    told = library_words(str(exc), 400).rstrip(".")
    return DataError(f"--tasks: lm-evaluation-harness stopped while scoring {names}: {type(exc).__name__}: {told}. "
                     "Check the task's settings (its YAML, or the model it runs on).")


# What simple_evaluate adds to its results besides the scores, which tuner does not keep: torch's collect_env report
# (it runs pip, nvidia-smi, lscpu, gcc ...: about 3 s a call, twice a demo) and git probes of the working folder
# (whose "fatal: not a git repository" git prints itself). Names in lm_eval.evaluator, replaced while tuner scores.
_NOT_KEPT = {"add_env_info": lambda storage: None, "get_git_commit_hash": lambda: None}


@contextlib.contextmanager
def _without_environment_report():
    from lm_eval import evaluator

    saved = {name: getattr(evaluator, name) for name in _NOT_KEPT if hasattr(evaluator, name)}
    for name in saved:
        setattr(evaluator, name, _NOT_KEPT[name])
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(evaluator, name, value)


def evaluate_model(loaded, label: str, tasks: list, batch_size: int) -> ModelResult:
    """Score ``loaded`` (a :class:`tuner.infer.load.LoadedModel`) on ``tasks`` (harness task configs or objects)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    for name in ("lm-eval", "lm_eval"):
        logging.getLogger(name).setLevel(logging.ERROR)
    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=batch_size)
    # the tasks come built (tuner.evaluate.tasks): a manager without the harness's index of its thousands of task
    # YAMLs, which would take longer to read than the held-out task of a small model takes to run
    try:
        with _without_environment_report():
            output = simple_evaluate(model=lm, tasks=tasks, task_manager=TaskManager(include_defaults=False),
                                     log_samples=True, bootstrap_iters=0,
                                     random_seed=0, numpy_random_seed=0, torch_random_seed=0)
    except Exception as exc:
        raise harness_failure(exc, tasks) from None
    result = ModelResult(label, loaded.target.describe())
    for task, values in output["results"].items():
        result.scores[task] = _metrics(values)
    from tuner.evaluate.tasks import HELD_OUT_TASK

    for sample in output.get("samples", {}).get(HELD_OUT_TASK, [])[:SHOWN]:
        doc, answer = sample["doc"], sample.get("filtered_resps") or sample.get("resps")
        while isinstance(answer, list):
            answer = answer[0] if answer else ""
        if isinstance(answer, str):
            result.examples.append((doc.get("shown", ""), doc.get("answer", ""), answer.strip()))
    return result
