"""training.report_to: the Trainer's own tracker integrations, each writing under the run directory, read back with
each tracker's own reader; a tracker that is not installed is refused before anything is written or launched."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_tuner
from tuner.cli import main
from tuner.rundir.events import read_records
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_path
from tuner.train.trackers import tracker_arguments, tracker_environment

ALL = "training.report_to=[tensorboard, mlflow, wandb, trackio]"
TRACKER_VARIABLES = ("TENSORBOARD_LOGGING_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE",
                     "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "TRACKIO_DIR")


def test_every_tracker_writes_under_the_run_directory(tmp_path):
    recipe = load_recipe(builtin_path("demo"), [ALL])
    env = tracker_environment(recipe, tmp_path, environ={})
    assert env == {
        "TENSORBOARD_LOGGING_DIR": str(tmp_path / "tensorboard"),
        "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true",
        "MLFLOW_EXPERIMENT_NAME": "demo",
        "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_PROJECT": "demo",
        "TRACKIO_DIR": str(tmp_path / "trackio"),
    }
    assert tracker_environment(load_recipe(builtin_path("demo")), tmp_path, environ={}) == {}, "default: none"


def test_what_the_user_set_wins(tmp_path):
    recipe = load_recipe(builtin_path("demo"), [ALL])
    env = tracker_environment(recipe, tmp_path, environ={"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
                                                         "WANDB_MODE": "online"})
    assert "MLFLOW_TRACKING_URI" not in env and "MLFLOW_ALLOW_FILE_STORE" not in env, "a server needs no file store"
    assert "WANDB_MODE" not in env and env["WANDB_DIR"] == str(tmp_path), "online W&B still keeps its files here"


def test_trainer_arguments_name_the_trackers_and_the_run(tmp_path):
    from transformers import TrainingArguments

    from tuner.train.__main__ import training_arguments

    recipe = load_recipe(builtin_path("demo"), ["training.report_to=tensorboard"])
    assert recipe.training.report_to == ["tensorboard"], "a single name is a list of one"
    args = training_arguments(recipe, tmp_path)
    assert args.report_to == ["tensorboard"] and args.run_name == "demo"
    assert training_arguments(load_recipe(builtin_path("demo")), tmp_path).report_to == []
    assert tracker_arguments(TrainingArguments, load_recipe(builtin_path("demo")), tmp_path)["report_to"] == "none"


def test_a_tracker_that_is_not_installed_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python spells "cannot be imported here"
    monkeypatch.chdir(tmp_path)
    assert main(["run", "demo", "--set", "training.report_to=[tensorboard, wandb]", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "training.report_to names wandb, which is not installed" in err
    assert "pip install 'tuner[wandb]'" in err
    assert not (tmp_path / "runs").exists(), "nothing rendered"
    assert main(["doctor", "demo", "--set", "training.report_to=[wandb]"]) == 1
    line = next(line for line in capsys.readouterr().out.splitlines() if " trackers " in line)
    assert line.startswith("FAIL") and "not installed: wandb" in line and "tuner[wandb]" in line


def test_doctor_says_which_trackers_are_installed(capsys):
    assert main(["doctor"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if " trackers " in line)
    assert line.startswith("ok") and "installed: tensorboard, mlflow, wandb, trackio" in line


def _events_losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in read_records(run_dir / "events.jsonl") if e["event"] == "step" and "loss" in e}


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> Path:
    """One real demo run through `tuner run` reporting to every tracker (a few steps)."""
    cwd = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as patch:
        for name in TRACKER_VARIABLES:  # the developer's own tracker settings stay out
            patch.delenv(name, raising=False)
        result = run_tuner("run", "demo", "--set", ALL, "--set", "data.max_samples=96", "--set",
                           "training.max_steps=4", "--set", "training.logging_steps=1", "--set",
                           "training.micro_batch_size=8", "--set", "training.warmup_steps=0", cwd=cwd)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run_dir = cwd / "runs" / "demo"
    assert sorted(_events_losses(run_dir)) == [1, 2, 3, 4]
    return run_dir


@pytest.mark.slow
@pytest.mark.xdist_group("tracked-run")
def test_tensorboard_reader_finds_the_loss(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (logdir,) = {path.parent for path in (tracked_run / "tensorboard").rglob("events.out.tfevents.*")}
    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    scalars = {event.step: event.value for event in accumulator.Scalars("train/loss")}
    assert scalars == pytest.approx(_events_losses(tracked_run), rel=1e-5)


@pytest.mark.slow
@pytest.mark.xdist_group("tracked-run")
def test_mlflow_client_finds_the_loss(tracked_run, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    client = MlflowClient((tracked_run / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("demo")
    (run,) = client.search_runs([experiment.experiment_id])
    history = {metric.step: metric.value for metric in client.get_metric_history(run.info.run_id, "loss")}
    assert history == pytest.approx(_events_losses(tracked_run), rel=1e-5)


@pytest.mark.slow
@pytest.mark.xdist_group("tracked-run")
def test_wandb_offline_run_holds_the_loss(tracked_run):
    """W&B's own reader of an offline run's transaction log: ``wandb leet inspect --json``."""
    (offline,) = (tracked_run / "wandb").glob("offline-run-*")
    wandb = Path(sys.executable).with_name("wandb")
    result = subprocess.run([str(wandb), "leet", "inspect", "--json", str(offline)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if '"type":"history"' in line]
    items = [record["history"]["item"] for record in records]
    logged = {item["train/global_step"]: item["train/loss"] for item in items if "train/loss" in item}
    assert logged == pytest.approx(_events_losses(tracked_run), rel=1e-5)


@pytest.mark.slow
@pytest.mark.xdist_group("tracked-run")
def test_trackio_database_holds_the_loss(tracked_run, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tracked_run / "trackio"))
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
            "(run,) = S.get_runs('demo'); print(json.dumps(S.get_logs('demo', run)))")
    # trackio reads TRACKIO_DIR when it is imported: a fresh interpreter sees this run's
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    logs = json.loads(result.stdout.splitlines()[-1])
    logged = {entry["train/global_step"]: entry["train/loss"] for entry in logs if "train/loss" in entry}
    assert logged == pytest.approx(_events_losses(tracked_run), rel=1e-5)
