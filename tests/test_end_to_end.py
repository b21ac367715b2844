"""The whole path once, for real: recipe -> render -> accelerate launch -> train -> save -> load."""
from __future__ import annotations

import pytest

from tuner.events import read_events
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_path
from tuner.render.run_directory import write_run_directory

TINY = ["data.max_samples=640", "training.max_steps=40", "training.logging_steps=5", "training.warmup_steps=5",
        "memory.micro_batch_size=16"]


def test_rendered_accelerate_config_loads_with_accelerates_own_loader(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    run_dir = write_run_directory(load_recipe(builtin_path("demo")), tmp_path / "run")
    config = load_config_from_file(str(run_dir / "accelerate.yaml"))
    assert config.num_processes == 1 and config.use_cpu is True and config.mixed_precision == "no"


@pytest.mark.slow
def test_tuner_run_trains_through_accelerate_launch(tmp_path, tuner_cli, demo_model_path):
    args = ["run", str(builtin_path("demo"))]
    for override in TINY + ["output.dir=" + str(tmp_path / "run")]:
        args += ["--set", override]
    result = tuner_cli(*args, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accelerate launch --config_file" in result.stdout

    run_dir = tmp_path / "run"
    losses = [e["loss"] for e in read_events(run_dir / "events.jsonl") if e["event"] == "step" and "loss" in e]
    assert len(losses) >= 5
    assert sum(losses[-2:]) / 2 < 0.8 * losses[0], f"loss did not go down: {losses}"
    finished = [e for e in read_events(run_dir / "events.jsonl") if e["event"] == "finished"]
    assert finished and finished[0]["step"] == 40

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    reference = AutoModelForCausalLM.from_pretrained(demo_model_path)
    trained = dict(model.named_parameters())
    changed = [name for name, p in reference.named_parameters() if not (p == trained[name]).all()]
    assert changed, "the saved model must hold the trained weights"
    assert (run_dir / "final" / "recipe.lock.yaml").is_file()
