"""The whole path once, for real: recipe -> render -> accelerate launch -> train -> save -> load."""
from __future__ import annotations

import pytest

from tuner.rundir.events import read_records
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_path
from tuner.render.run_directory import write_run_directory

TINY = ["data.max_samples=640", "training.max_steps=40", "training.logging_steps=5", "training.warmup_steps=5",
        "training.micro_batch_size=16"]


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
    losses = [e["loss"] for e in read_records(run_dir / "events.jsonl") if e["event"] == "step" and "loss" in e]
    assert len(losses) >= 5
    assert sum(losses[-2:]) / 2 < 0.8 * losses[0], f"loss did not go down: {losses}"
    finished = [e for e in read_records(run_dir / "events.jsonl") if e["event"] == "finished"]
    assert finished and finished[0]["step"] == 40

    # it ends with the summary: where the model is, the losses, plan beside measured memory, time, what next
    lines = result.stdout.rstrip().splitlines()
    last = lines[max(index for index, line in enumerate(lines) if line.startswith("finished in ")):]
    assert f" 40 steps; model saved in {run_dir / 'final'}" in last[0], last
    assert last[1].startswith(f"  train loss {losses[0]:.4f} -> {losses[-1]:.4f}, held-out loss ") and "tokens/s" in last[1]
    assert last[2].startswith("  memory: plan predicted ") and "measured" in last[2]
    assert last[3:] == ["next:", f'  tuner infer {run_dir} --prompt "..."', f"  tuner chat {run_dir}",
                        f"  tuner eval {run_dir} --baseline", f"  tuner export {run_dir} --format ollama"]

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    reference = AutoModelForCausalLM.from_pretrained(demo_model_path)
    trained = dict(model.named_parameters())
    changed = [name for name, p in reference.named_parameters() if not (p == trained[name]).all()]
    assert changed, "the saved model must hold the trained weights"
    assert (run_dir / "final" / "recipe.lock.yaml").is_file()
