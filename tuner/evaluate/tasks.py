"""The task built from a recipe's held-out split, as an lm-evaluation-harness task config, so every run can be
evaluated offline on samples it never trained on:

- instruction and chat data: greedy generation from the prompt as training rendered it, until the EOS token,
  scored by :data:`ANSWER_SCORES` (exact match after stripping spaces; the hook for objectives with their own
  score, such as a GRPO reward);
- preference pairs (dpo): log-likelihood of the chosen and the rejected answer, ``acc`` being the share of pairs
  where the chosen one is more likely;
- text: the rolling log-likelihood of each held-out text (word and byte perplexity, bits per byte).

Named tasks are the harness's own (``--tasks``, ``--include-path`` for task YAMLs of your own); one whose data is
not local and cannot be fetched is refused naming its dataset.
"""
from __future__ import annotations

from typing import Callable

from tuner.evaluate import TaskDataMissing
from tuner.recipe.schema import Recipe

HELD_OUT_TASK = "held_out"
EXACT_MATCH = "exact_match"


def exact_match_score(recipe: Recipe) -> Callable[[dict, str], dict[str, float]]:
    """1.0 when the answer, stripped of surrounding spaces, is the expected one."""
    def score(doc: dict, answer: str) -> dict[str, float]:
        return {EXACT_MATCH: float(answer.strip() == doc["answer"].strip())}

    return score


# objective.kind -> a function of the recipe returning score(doc, answer) -> {metric: value}.  An objective that
# trains on a reward (grpo) registers its own here, scoring held-out answers with the recipe's reward functions;
# every metric it returns is averaged over the held-out samples.
ANSWER_SCORES: dict[str, Callable[[Recipe], Callable[[dict, str], dict[str, float]]]] = {}


def answer_score(recipe: Recipe):
    return ANSWER_SCORES.get(recipe.objective.kind, exact_match_score)(recipe)


def held_out_task(recipe: Recipe, tokenizer, limit: int | None = None) -> dict:
    """The harness task config for the recipe's held-out samples (DataError when it holds none out)."""
    from tuner.data.held_out import as_question, held_out_samples

    samples, data_format = held_out_samples(recipe)
    questions = [as_question(sample, data_format, tokenizer) for sample in samples[:limit]]
    rows = [{"prompt": q.prompt, "answer": q.expected or "", "rejected": q.rejected or "", "shown": q.shown}
            for q in questions]

    def dataset(**_):
        import datasets

        return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})

    config = {"task": HELD_OUT_TASK, "custom_dataset": dataset, "test_split": "test",
              "metadata": {"version": 1, "recipe": recipe.name, "format": data_format}}
    if data_format == "text":
        return {**config, "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{prompt}}",
                "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")]}
    if data_format == "preference":
        return {**config, "output_type": "multiple_choice", "doc_to_text": "{{prompt}}", "target_delimiter": "",
                "doc_to_choice": lambda doc: [doc["answer"], doc["rejected"]], "doc_to_target": 0,
                "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    longest = max((len(tokenizer(row["answer"], add_special_tokens=False)["input_ids"]) for row in rows), default=1)
    score = answer_score(recipe)
    metrics = sorted(score(rows[0], rows[0]["answer"])) if rows else [EXACT_MATCH]
    return {**config, "output_type": "generate_until", "doc_to_text": "{{prompt}}", "doc_to_target": "{{answer}}",
            "target_delimiter": "",
            "generation_kwargs": {"until": [tokenizer.eos_token], "do_sample": False,
                                  "max_gen_toks": min(longest + 2, recipe.inference.max_new_tokens)},
            "process_results": lambda doc, results: score(doc, results[0]),
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in metrics]}


def task_manager(include_path: str | None):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path) if include_path else TaskManager()


def load_named_tasks(names: list[str], include_path: str | None) -> list:
    """The harness's tasks by name, each with its data loaded; DataError for a name the harness does not know,
    :class:`TaskDataMissing` (naming the dataset) for data that is neither local nor fetchable."""
    from tuner.data.sources import DataError

    manager = task_manager(include_path)
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown:
        raise DataError(f"--tasks: {', '.join(unknown)}: not a task, group or tag lm-evaluation-harness knows"
                        f"{' (nor one in ' + include_path + ')' if include_path else ''}; `lm-eval ls tasks` lists "
                        "them, --include-path DIR adds your own task YAMLs.")
    loaded = []
    for name in names:
        try:
            loaded += list(manager.load([name])["tasks"].values())
        except Exception as exc:  # datasets' errors for a dataset not cached offline have no common base class
            entry = manager.task_index.get(name)
            dataset = (entry.cfg or {}).get("dataset_path") if entry else None
            offline = "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set and it is not in the local cache"
            raise TaskDataMissing(f"--tasks {name}: its data{f' (dataset {dataset})' if dataset else ''} could not "
                                  f"be loaded: {' '.join(str(exc).split())[:300]} — {offline}, or it cannot be "
                                  "reached. Download it where there is network (it lands in the datasets cache) or "
                                  "point the task's dataset_path/data_files at local files.") from None
    return loaded
