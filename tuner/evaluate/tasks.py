"""The task built from a recipe's held-out split, as an lm-evaluation-harness task config, so every run can be
evaluated offline on samples it never trained on:

- instruction and chat data: greedy generation from the prompt as training rendered it, until the EOS token,
  scored by exact match after stripping spaces;
- grpo prompts: greedy generation scored by the recipe's own rewards (:func:`reward_score`, through
  :data:`ANSWER_SCORES`, the hook for an objective with its own score);
- preference pairs (dpo): log-likelihood of the chosen and the rejected answer, ``acc`` being the share of pairs
  where the chosen one is more likely;
- text: the rolling log-likelihood of each held-out text (word and byte perplexity, bits per byte).

Named tasks are the harness's own (``--tasks``, ``--include-path`` for task YAMLs of your own); one whose data is
not local and cannot be fetched is refused naming its dataset.  A task YAML may name Python code (``!function
module.name``), which the harness imports and runs when it loads the task: :func:`task_code` finds every such tag
in an ``--include-path`` folder (and the files its tasks include) without running anything, so ``tuner eval`` can
name them and run them only when asked to (``--allow-task-code``).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Callable

from tuner.evaluate import TaskDataMissing
from tuner.reason import library_words
from tuner.recipe.schema import Recipe

HELD_OUT_TASK = "held_out"
EXACT_MATCH = "exact_match"


def exact_match_score(recipe: Recipe, tokenizer) -> Callable[[dict, str], dict[str, float]]:
    """1.0 when the answer, stripped of surrounding spaces, is the expected one."""
    def score(doc: dict, answer: str) -> dict[str, float]:
        return {EXACT_MATCH: float(answer.strip() == doc["answer"].strip())}

    return score


REWARD = "reward"  # a grpo recipe's held-out metric: its rewards' weighted sum, as TRL logs it while training


def reward_score(recipe: Recipe, tokenizer) -> Callable[[dict, str], dict[str, float]]:
    """A grpo recipe's own rewards on each held-out answer: the weighted sum (``reward``) and each reward by the
    name TRL logs it under; a reward that fails is refused naming it and the prompt, as in training."""
    from tuner.data.sources import DataError
    from tuner.recipe.rewards import reward_names
    from tuner.train.rewards import RewardError, reward_functions

    rewards = recipe.objective.grpo.rewards
    names = reward_names(rewards)
    functions, reward_tokenizers = reward_functions(recipe)

    def one(function, reward_tokenizer, doc: dict, answer: str) -> float:
        if reward_tokenizer is None:
            ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
            return function(prompts=[doc["prompt"]], completions=[answer], completion_ids=[ids],
                            **{key: [value] for key, value in json.loads(doc["reward_inputs"]).items()})[0]
        import torch

        with torch.no_grad():  # a reward model scores prompt and answer together, as TRL's GRPOTrainer does
            encoded = reward_tokenizer(doc["prompt"] + answer, return_tensors="pt").to(function.device)
            return function(**encoded).logits[0, 0].item()

    def score(doc: dict, answer: str) -> dict[str, float]:
        try:
            values = [one(f, t, doc, answer) for f, t in zip(functions, reward_tokenizers)]
        except RewardError as exc:
            raise DataError(str(exc)) from None
        total = sum(r.weight * v for r, v in zip(rewards, values) if not math.isnan(v))
        return {REWARD: total, **dict(zip(names, values))}

    return score


# objective.kind -> a function of (recipe, tokenizer) returning score(doc, answer) -> {metric: value}, averaged over
# the held-out samples; every other objective scores by exact match.
ANSWER_SCORES: dict[str, Callable[[Recipe, object], Callable[[dict, str], dict[str, float]]]] = {"grpo": reward_score}


def answer_score(recipe: Recipe, tokenizer):
    return ANSWER_SCORES.get(recipe.objective.kind, exact_match_score)(recipe, tokenizer)


def held_out_task(recipe: Recipe, tokenizer, limit: int | None = None) -> dict:
    """The harness task config for the recipe's held-out samples (DataError when it holds none out)."""
    from tuner.data.held_out import as_question, held_out_samples

    samples, data_format = held_out_samples(recipe)
    questions = [as_question(sample, data_format, tokenizer, recipe) for sample in samples[:limit]]
    rows = [{"prompt": q.prompt, "answer": q.expected or "", "rejected": q.rejected or "", "shown": q.shown,
             "reward_inputs": json.dumps(q.reward_inputs, default=str)} for q in questions]

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
    if recipe.objective.kind == "grpo":  # as long as training let completions grow
        longest = recipe.objective.grpo.max_completion_length
    else:
        longest = max((len(tokenizer(row["answer"], add_special_tokens=False)["input_ids"]) for row in rows),
                      default=1) + 2
    score = answer_score(recipe, tokenizer)
    metrics = list(score(rows[0], rows[0]["answer"])) if rows else [EXACT_MATCH]
    return {**config, "output_type": "generate_until", "doc_to_text": "{{prompt}}", "doc_to_target": "{{answer}}",
            "target_delimiter": "",
            "generation_kwargs": {"until": [tokenizer.eos_token], "do_sample": False,
                                  "max_gen_toks": min(longest, recipe.inference.max_new_tokens)},
            "process_results": lambda doc, results: score(doc, results[0]),
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in metrics]}


TASK_FILE_BYTES = 4 * 2 ** 20  # a task YAML is a few KiB; a larger file is not read for tags (the harness reads it)
CODE_TAG = "!function"  # lm-eval's YAML tag for a Python function of a file beside the YAML


def task_code(include_path: str | Path) -> list[str]:
    """``file:line: !function module.name`` for every Python function a task YAML under ``include_path`` (or a
    YAML one of them includes, wherever it is) names: the code the harness would import and run.  The YAML is
    composed, not constructed (tags resolved as the harness's loader resolves them, %TAG directives included), so
    nothing runs; a file that does not parse is left for the harness to refuse."""
    import yaml

    from tuner.fileio import TooLarge, read_limited

    pending = sorted(path for pattern in ("*.yaml", "*.yml") for path in Path(include_path).rglob(pattern))
    seen: set[Path] = set()
    found = []
    while pending:
        path = pending.pop(0).resolve()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            root = yaml.compose(read_limited(path, TASK_FILE_BYTES, pipes=False).decode("utf-8"),
                                Loader=yaml.SafeLoader)
        except (OSError, TooLarge, UnicodeDecodeError, yaml.YAMLError, RecursionError):
            continue
        nodes = [root] if root is not None else []
        while nodes:
            node = nodes.pop()
            if node.tag == CODE_TAG:
                found.append(f"{path}:{node.start_mark.line + 1}: {CODE_TAG} {node.value}")
            elif isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    nodes += [key, value]
                    if node is root and isinstance(key, yaml.ScalarNode) and key.value == "include":
                        included = value.value if isinstance(value, yaml.SequenceNode) else [value]
                        pending += [path.parent / item.value for item in included if isinstance(item, yaml.ScalarNode)]
            elif isinstance(node, yaml.SequenceNode):
                nodes += node.value
    return found


@functools.lru_cache(maxsize=4)
def task_manager(names: tuple[str, ...], include_path: str | None):
    """The harness's task index, built once per process: the ``--include-path`` folder alone when it holds every
    name (the harness's own index reads thousands of YAML files, tens of seconds), else that folder and the
    harness's own tasks."""
    from lm_eval.tasks import TaskManager

    if include_path:
        own = TaskManager(include_path=include_path, include_defaults=False)
        if all(name in own.all_tasks for name in names):
            return own
    return TaskManager(include_path=include_path) if include_path else TaskManager()


def load_named_tasks(names: list[str], include_path: str | None) -> list:
    """The harness's tasks by name, each with its data loaded; DataError for a name the harness does not know,
    :class:`TaskDataMissing` (naming the dataset) for data that is neither local nor fetchable."""
    from tuner.data.sources import DataError

    manager = task_manager(tuple(names), include_path)
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
                                  f"be loaded: {library_words(exc)} — {offline}, or it cannot be "
                                  "reached. Download it where there is network (it lands in the datasets cache) or "
                                  "point the task's dataset_path/data_files at local files.") from None
    return loaded
