"""Real training runs of the tiny demo model through the entrypoint: full, LoRA, QLoRA, resume, merge.

Runs are in-process (``tuner.train.__main__.main``) to skip the import cost, except the one
that is killed with SIGKILL.  Each trains a few steps on a few dozen samples.
"""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.rundir.events import read_records
from tuner.rundir.checkpoints import latest_complete_checkpoint
from tuner.rundir.checkpoints import resume_settings
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import recipes_dir
from tuner.render.run_directory import write_run_directory
from tuner.rundir.layout import CHECKPOINT_INFO
from tuner.train.__main__ import main as train_main

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

TINY = ["data.max_samples=96", "data.eval_fraction=0.25", "training.micro_batch_size=8", "training.max_steps=6",
        "training.warmup_steps=0", "training.logging_steps=1", "training.eval_steps=null"]


def make_run(tmp_path: Path, recipe: str, *overrides: str) -> Path:
    """Render a run directory from a shipped recipe made tiny; returns its lock file."""
    parsed = load_recipe(recipes_dir() / recipe, [*TINY, *overrides])
    run_dir = write_run_directory(parsed, tmp_path / recipe.removesuffix(".yaml"))
    return run_dir / "recipe.lock.yaml"


def steps(run_dir: Path) -> list[dict]:
    return [e for e in read_records(run_dir / "events.jsonl") if e["event"] == "step" and "loss" in e]


def check_finished_run(run_dir: Path) -> dict:
    events = read_records(run_dir / "events.jsonl")
    finished = events[-1]
    assert finished["event"] == "finished" and finished["step"] == 6
    logged = steps(run_dir)
    assert [e["step"] for e in logged] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "learning_rate", "grad_norm", "tokens_per_s", "samples_per_s", "eta_s", "peak_rss_gib"):
        assert key in logged[-1], key
    assert 0 < logged[-1]["tokens_per_s"] and logged[-1]["peak_rss_gib"] > 0.1
    assert logged[-1]["loss"] < logged[0]["loss"], "a few steps at this learning rate must lower the loss"
    assert finished["eval_loss"] < logged[0]["loss"]
    memory = json.loads((run_dir / "memory.json").read_text())
    assert memory["measured_gib"] > 0.1 and "measured" in memory["line"]
    final = run_dir / "final"
    assert {"tokenizer.json", "recipe.lock.yaml"} <= {p.name for p in final.iterdir()}
    umask = os.umask(0)
    os.umask(umask)
    saved = [path for path in [*final.iterdir(), *run_dir.glob("checkpoints/*/*")] if path.is_file()]
    modes = {path.name: path.stat().st_mode & 0o777 for path in saved}
    assert set(modes.values()) == {0o666 & ~umask}, modes  # what tuner saves is as readable as any file it writes
    return finished


def test_full_fine_tune_saves_full_weights_and_a_profile(tmp_path):
    lock = make_run(tmp_path, "demo.yaml")
    assert train_main([str(lock), "--profile", "2"]) == 0
    run_dir = lock.parent
    check_finished_run(run_dir)
    assert (run_dir / "final" / "model.safetensors").is_file()
    assert (run_dir / "profile" / "trace.json").stat().st_size > 1000
    assert "Self CPU" in (run_dir / "profile" / "ops.txt").read_text()


def test_chunked_loss_trains_and_evaluates_through_the_trainer(tmp_path, caplog):
    """memory.chunked_loss in a real run: the Trainer's loss (with num_items_in_batch) and evaluation go through it."""
    lock = make_run(tmp_path, "demo-lora.yaml", "memory.chunked_loss=true", "training.gradient_accumulation_steps=2")
    with caplog.at_level("INFO", logger="tuner"):
        assert train_main([str(lock)]) == 0
    check_finished_run(lock.parent)
    assert "loss: chunked linear cross-entropy" in caplog.text


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    lock = make_run(tmp_path_factory.mktemp("lora"), "demo-lora.yaml", "memory.gradient_checkpointing=true",
                    "training.optimizer=adamw_8bit")
    assert train_main([str(lock)]) == 0
    return lock.parent


@pytest.mark.xdist_group("lora-run")
def test_lora_saves_only_the_adapter(lora_run):
    check_finished_run(lora_run)
    names = {p.name for p in (lora_run / "final").iterdir()}
    assert "adapter_model.safetensors" in names and "model.safetensors" not in names


def test_qlora_trains_a_4bit_model_on_the_cpu(tmp_path):
    lock = make_run(tmp_path, "demo-qlora.yaml", "training.optimizer=paged_adamw_8bit")
    assert train_main([str(lock)]) == 0
    check_finished_run(lock.parent)
    adapter = json.loads((lock.parent / "final" / "adapter_config.json").read_text())
    assert adapter["r"] == 16 and adapter["target_modules"]


@pytest.mark.xdist_group("lora-run")
def test_merged_model_answers_like_the_adapter(lora_run, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tuner.cli import main as cli_main
    from tuner.loading.model import resolve_model_path

    assert cli_main(["merge", str(lora_run), "-o", str(tmp_path / "merged")]) == 0
    assert cli_main(["merge", str(lora_run), "-o", str(tmp_path / "merged")]) == 2  # no overwrite without --force
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base_path = resolve_model_path("builtin:demo")
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), str(lora_run / "final"))
    inputs = torch.tensor([[5, 9, 17, 23, 30, 41, 7, 12]])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(base_path).eval()(inputs).logits
        expected, got = adapted.eval()(inputs).logits, merged.eval()(inputs).logits
    assert (expected - base).abs().max() > 1e-3, "the adapter must change the outputs for this check to mean anything"
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_resume_after_sigkill_continues_the_same_loss_curve(tmp_path, caplog):
    """The resumed run trains on the dataset the killed run prepared (the cache), and on the same loss curve."""
    resumable = ["data.eval_fraction=0", "training.max_steps=12", "training.save_steps=4", "training.resume=auto"]
    straight = make_run(tmp_path / "straight", "demo.yaml", *resumable)
    killed = make_run(tmp_path / "killed", "demo.yaml", *resumable)

    process = subprocess.Popen([sys.executable, "-m", "tuner.train", str(killed)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 240
        while not any(e["event"] == "checkpoint" for e in read_records(killed.parent / "events.jsonl")):
            assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    events = read_records(killed.parent / "events.jsonl")
    assert not any(e["event"] == "finished" for e in events), "killed too late: the run had finished"
    saved = max(e["step"] for e in events if e["event"] == "checkpoint")
    # a checkpoint the kill interrupted while saving: no tuner_checkpoint.json, so resume must skip it
    partial = killed.parent / "checkpoints" / "checkpoint-11"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    assert latest_complete_checkpoint(killed.parent / "checkpoints").name == f"checkpoint-{saved}"

    with caplog.at_level("INFO", logger="tuner"):
        assert train_main([str(killed)]) == 0
    assert "data: reusing the prepared dataset" in caplog.text  # the killed run's, not prepared again
    assert train_main([str(straight)]) == 0
    resumed = [e for e in read_records(killed.parent / "events.jsonl") if e["event"] == "started"][-1]
    assert resumed["resumed_from_step"] == saved
    after = {e["step"]: e["loss"] for e in steps(killed.parent) if e["time"] >= resumed["time"]}
    reference = {e["step"]: e["loss"] for e in steps(straight.parent)}
    assert sorted(after) == list(range(saved + 1, 13))
    for step, loss in after.items():
        assert loss == pytest.approx(reference[step], rel=1e-3, abs=1e-4), step
    finals = [read_records(lock.parent / "events.jsonl")[-1] for lock in (killed, straight)]
    assert finals[0]["event"] == finals[1]["event"] == "finished" and finals[0]["step"] == finals[1]["step"] == 12


def fake_checkpoint(lock: Path, step: int, **changed) -> Path:
    """A complete-looking checkpoint whose stored settings differ as given (simulates another launch)."""
    recipe = load_recipe(lock)
    settings = {**resume_settings(recipe, world_size=1), **changed}
    checkpoint = lock.parent / "checkpoints" / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))  # what resume reads
    (checkpoint / "adapter_model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")  # whole, holding no tensors
    (checkpoint / CHECKPOINT_INFO).write_text(json.dumps({"step": step, "settings": settings}))
    return checkpoint


def test_resume_refused_when_the_world_size_changed(tmp_path, capsys):
    """The checkpoint's stored metadata says 2 processes; this launch has 1 (WORLD_SIZE unset)."""
    lock = make_run(tmp_path, "demo-lora.yaml", "training.resume=auto")
    fake_checkpoint(lock, 4, **{"hardware.num_processes": 2, "method.lora.r": 8})
    assert train_main([str(lock)]) == 2
    message = capsys.readouterr().err
    assert "cannot resume from" in message and "checkpoint-4" in message
    assert "hardware.num_processes: saved with 2, the recipe now has 1" in message
    assert "method.lora.r: saved with 8, the recipe now has 16" in message
    error = read_records(lock.parent / "events.jsonl")[-1]
    assert error["event"] == "error" and "hardware.num_processes" in error["message"]


def test_resume_refused_when_the_tensor_parallel_split_changed(tmp_path, capsys):
    """A checkpoint of a tp 2 run holds each rank's slices; a launch without tp cannot load them."""
    lock = make_run(tmp_path, "demo-lora.yaml", "training.resume=auto")
    fake_checkpoint(lock, 4, **{"parallelism.tp": 2})
    assert train_main([str(lock)]) == 2
    assert "parallelism.tp: saved with 2, the recipe now has 1" in capsys.readouterr().err


def test_resume_accepts_unchanged_settings(tmp_path):
    from tuner.rundir.checkpoints import resume_checkpoint

    lock = make_run(tmp_path, "demo-qlora.yaml", "training.resume=auto")
    checkpoint = fake_checkpoint(lock, 3)
    assert resume_checkpoint(load_recipe(lock), lock.parent, world_size=1) == checkpoint


def test_8bit_base_with_lora_trains_on_the_cpu():
    """bits: 8 loads Linear8bitLt layers; gradients reach the adapters only."""
    import torch

    from tuner.loading.model import count_parameters, load_model, trainable_model

    recipe = load_recipe(recipes_dir() / "demo-qlora.yaml", ["method.quantization.bits=8"])
    model = trainable_model(load_model(recipe), recipe)
    assert type(model.base_model.model.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear8bitLt"
    trainable, total = count_parameters(model)
    assert 0 < trainable < total
    inputs = torch.tensor([[5, 9, 17, 23, 30]])
    model(input_ids=inputs, labels=inputs).loss.backward()
    grads = [name for name, p in model.named_parameters() if p.grad is not None]
    assert grads and all("lora_" in name or "modules_to_save" in name for name in grads)
