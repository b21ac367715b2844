"""tuner eval: the trained demo run through lm-evaluation-harness, base beside fine-tuned, on the task built from
its held-out split and on a named harness task whose data is local; results saved under the run; tasks whose data
is not here refused naming the dataset."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import library_noise

from tuner.data.reverse import reverse_samples

pytestmark = pytest.mark.slow  # runs lm-eval on the demo model


def local_task(folder: Path) -> Path:
    """A harness task YAML of one's own (--include-path): pick the reversal over the word itself, by log-likelihood,
    on words from a local JSON-lines file."""
    folder.mkdir(parents=True, exist_ok=True)
    words = [sample["input"] for sample in reverse_samples(40, seed=7)]
    (folder / "words.jsonl").write_text("".join(json.dumps({"word": w}) + "\n" for w in words))
    (folder / "reverse_choice.yaml").write_text(f"""task: reverse_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / 'words.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "reverse\\n{{{{word}}}}="
target_delimiter: ""
doc_to_choice: "{{{{[word[::-1], word]}}}}"
doc_to_target: 0
metric_list:
  - metric: acc
metadata:
  version: 1
""")
    return folder


def score(output: str, task: str, metric: str) -> tuple[float, float]:
    """(base, fine-tuned) of one row of the printed table."""
    row = next(line for line in output.splitlines() if f" {task} " in line and f" {metric} " in line)
    cells = [cell.strip() for cell in row.strip("│┃ ").split("│")]
    return float(cells[2]), float(cells[3])


@pytest.mark.xdist_group("trained-demo")
def test_demo_run_beats_its_base_on_held_out_and_a_local_harness_task(trained_demo, tmp_path, tuner_cli):
    tasks = local_task(tmp_path / "tasks")
    result = tuner_cli("eval", str(trained_demo), "--baseline", "--tasks", "reverse_choice",
                       "--include-path", str(tasks))
    assert result.returncode == 0, result.stderr[-3000:]
    base, tuned = score(result.stdout, "held_out", "exact_match")
    assert base == 0 and tuned >= 0.3, result.stdout
    base, tuned = score(result.stdout, "reverse_choice", "acc")
    assert tuned > base, result.stdout
    saved = sorted((trained_demo / "eval").glob("eval-*.json"))
    assert saved and f"results saved in {saved[-1]}" in result.stderr
    assert not library_noise(result.stdout + result.stderr), result.stderr  # lm-eval's bars: in the run's log
    models = json.loads(saved[-1].read_text())["models"]
    assert [m["label"] for m in models] == ["base", "fine-tuned"]
    assert models[1]["scores"]["held_out"]["exact_match"] == tuned or models[1]["scores"]["reverse_choice"]["acc"] == tuned


def test_a_task_whose_data_is_not_here_exits_1_naming_the_dataset(tmp_path, demo_model_path, tuner_cli):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "remote.yaml").write_text("task: remote_words\ndataset_path: someorg/missing-words\ntest_split: test\n"
                                       "output_type: multiple_choice\ndoc_to_text: x\ndoc_to_choice: [a, b]\n"
                                       "doc_to_target: 0\nmetric_list:\n  - metric: acc\n")
    result = tuner_cli("eval", "--model", str(demo_model_path), "--no-held-out", "--tasks", "remote_words",
                       "--include-path", str(tasks), env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert result.returncode == 1, result.stderr[-2000:]
    assert "--tasks remote_words: its data (dataset someorg/missing-words) could not be loaded" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_task_and_a_run_without_held_out_samples_are_refused(demo_model_path, capsys):
    from tuner.cli import main

    assert main(["eval", "--model", str(demo_model_path), "--tasks", "no_such_task_anywhere"]) == 2
    assert "no_such_task_anywhere: not a task" in capsys.readouterr().err
    assert main(["eval", "demo", "--set", "data.eval_fraction=0"]) == 2
    assert "data.eval_fraction is 0" in capsys.readouterr().err


def test_preference_pairs_are_scored_by_log_likelihood_and_an_objective_can_bring_its_own_score(demo_model_path):
    from transformers import AutoTokenizer

    from tuner.evaluate import tasks
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_path

    tokenizer = AutoTokenizer.from_pretrained(demo_model_path)
    pairs = tasks.held_out_task(load_recipe(builtin_path("demo-dpo"), ["model.id=builtin:demo"]), tokenizer, limit=3)
    assert pairs["output_type"] == "multiple_choice" and pairs["doc_to_target"] == 0
    doc = pairs["custom_dataset"]()["test"][0]
    assert pairs["doc_to_choice"](doc)[0] == doc["answer"] != doc["rejected"]
    recipe = load_recipe(builtin_path("demo"))
    tasks.ANSWER_SCORES[recipe.objective.kind] = lambda r, tokenizer: lambda d, answer: {"reward": float(len(answer))}
    try:
        generation = tasks.held_out_task(recipe, tokenizer, limit=2)
    finally:
        del tasks.ANSWER_SCORES[recipe.objective.kind]
    assert [m["metric"] for m in generation["metric_list"]] == ["reward"]
    assert generation["process_results"]({"answer": "x"}, ["abc"]) == {"reward": 3.0}


GRPO_REWARDS = "objective.grpo.rewards=[{kind: exact_match, column: answer, weight: 2}, {kind: length, target_tokens: 1}]"


def test_a_grpo_recipe_is_scored_by_its_own_weighted_rewards(demo_model_path):
    """(tuner demo --recipe demo-grpo, in test_grpo.py, runs this task through the harness before and after.)"""
    from transformers import AutoTokenizer

    from tuner.evaluate.tasks import held_out_task
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_path

    overrides = ["model.id=builtin:demo", GRPO_REWARDS]
    task = held_out_task(load_recipe(builtin_path("demo-grpo"), overrides), AutoTokenizer.from_pretrained(
        demo_model_path), limit=2)
    doc = task["custom_dataset"]()["test"][0]
    assert doc["answer"] == doc["shown"][::-1]  # the column exact_match reads: the prompt's word reversed
    right, wrong = (task["process_results"](doc, [answer]) for answer in (doc["answer"], doc["answer"] + "x"))
    length = -(len(doc["answer"]) - 1) / 8  # tokens past target_tokens over max_completion_length (the demo's 8)
    assert right == {"reward": 2 + length, "exact_match(answer)": 1.0, "length": length}
    assert wrong["exact_match(answer)"] == 0 and wrong["reward"] < right["reward"]
    assert [m["metric"] for m in task["metric_list"]] == ["reward", "exact_match(answer)", "length"]


def test_scores_go_to_the_runs_tensorboard_and_mlflow_read_back_by_their_own_readers(tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tuner.evaluate.harness import ModelResult
    from tuner.evaluate.results import report_to_trackers
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_path

    for name in ("TENSORBOARD_LOGGING_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.setenv(name, "")  # what report_to_trackers sets is undone after the test
        monkeypatch.delenv(name)
    recipe = load_recipe(builtin_path("demo"), ["training.report_to=[tensorboard, mlflow, wandb]"])
    results = [ModelResult("base", "m", {"held_out": {"exact_match": 0.0}}),
               ModelResult("fine-tuned", "m", {"held_out": {"exact_match": 0.75}})]
    lines = report_to_trackers(recipe, tmp_path, results)
    assert lines[-1] == "not sent to wandb: tuner eval writes to tensorboard and mlflow only"
    (logdir,) = {path.parent for path in (tmp_path / "tensorboard").rglob("events.out.tfevents.*")}
    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    assert [e.value for e in accumulator.Scalars("eval/fine-tuned/held_out/exact_match")] == [0.75]
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("demo").experiment_id])
    assert run.data.metrics == {"eval.base.held_out.exact_match": 0.0, "eval.fine-tuned.held_out.exact_match": 0.75}
