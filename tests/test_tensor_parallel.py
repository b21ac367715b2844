"""Tensor-parallel training for real: `tuner run demo-tp` on two gloo CPU ranks (DeepSpeed AutoTP over ZeRO-1).

The run is tensor parallel, not two copies of one run nor data parallelism: both ranks train on the same batches,
each holds half of every split weight (q/k/v/gate/up by output rows, o/down by input columns, the tied
embedding and head by vocabulary) and the whole norms; the loss falls; the saved model (and a checkpoint's) loads
whole with plain from_pretrained, its weights are the ranks' slices put together, and it computes the held-out loss
the run reported.  The fsdp + tp path (transformers' own split at load) is taken as far as CPU ranks allow.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from test_cpu_ranks import free_port

from conftest import builds_of

from tuner.rundir.events import read_records

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ranks")]  # one multi-rank run at a time

SPLIT_BY_OUTPUT = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens")
SPLIT_BY_INPUT = ("o_proj", "down_proj")


def mean_sample_tokens(run_dir: Path) -> float:
    from tuner.data.prepared import prepare_data
    from tuner.loading.model import load_tokenizer
    from tuner.recipe import load_recipe

    recipe = load_recipe(run_dir / "recipe.lock.yaml")
    lengths = [len(sample["input_ids"]) for sample in prepare_data(recipe, load_tokenizer(recipe)).train]
    return sum(lengths) / len(lengths)


def held_out_loss(run_dir: Path, model_dir: Path) -> float:
    """The Trainer's held-out loss of ``model_dir`` in one process: the mean loss of the run's evaluation batches."""
    import torch
    from transformers import AutoModelForCausalLM

    from tuner.data.prepare import data_collator
    from tuner.data.prepared import prepare_data
    from tuner.loading.model import load_tokenizer
    from tuner.recipe import load_recipe
    from tuner.train.parallelism import whole_eval_batch

    recipe = load_recipe(run_dir / "recipe.lock.yaml")
    tokenizer = load_tokenizer(recipe)
    samples = list(prepare_data(recipe, tokenizer).eval)
    collate = data_collator(recipe, tokenizer)
    size = whole_eval_batch(recipe.training.micro_batch_size, len(samples))
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        losses = [float(model(**collate(samples[i:i + size])).loss) for i in range(0, len(samples), size)]
    return sum(losses) / len(losses)


def test_demo_tp_trains_with_two_tensor_parallel_ranks(tmp_path, tuner_cli, monkeypatch):
    """On a cold home of its own, as a new user's: both ranks ask for the demo model and the prepared dataset at
    once, and one of them builds each while the other waits."""
    from transformers import AutoModelForCausalLM

    extensions, home = tmp_path / "torch_extensions", tmp_path / "home"
    result = tuner_cli("run", "demo-tp", "--set", f"hardware.main_process_port={free_port()}",
                       "--set", "training.save_steps=15", cwd=tmp_path,
                       env={"TUNER_TRACE_RANKS": "1", "TORCH_EXTENSIONS_DIR": str(extensions), "OMP_NUM_THREADS": "1",
                            "TUNER_HOME": str(home)}, timeout=300)
    run_dir = tmp_path / "runs" / "demo-tp"
    assert result.returncode == 0, result.stdout + result.stderr + (run_dir / "train.log").read_text()[-3000:]
    ranks_log = (run_dir / "train.log").read_text()
    assert builds_of(ranks_log, "the built-in demo model") == 1 and builds_of(ranks_log, "the prepared dataset") == 1
    monkeypatch.setenv("TUNER_HOME", str(home))  # what the checks below prepare or load is the run's
    events = read_records(run_dir / "events.jsonl")
    assert next(e for e in events if e["event"] == "started")["world_size"] == 2

    batches = {e["rank"]: e["samples"] for e in events if e["event"] == "rank_batch"}
    assert sorted(batches) == [0, 1] and batches[0] == batches[1], "a tp group must see the same batches"
    losses = [e["loss"] for e in events if e["event"] == "step" and "loss" in e]
    assert len(losses) >= 6 and losses[-1] < losses[0] - 1.0, losses

    final = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    whole = {name: list(parameter.shape) for name, parameter in final.named_parameters()}
    finished = {e["rank"]: e for e in events if e["event"] == "rank_finished"}
    assert sorted(finished) == [0, 1]
    for rank, event in finished.items():
        held = event["shapes"]
        assert held.keys() == whole.keys()
        for name, shape in whole.items():
            if name.endswith(".weight") and any(part in name for part in SPLIT_BY_OUTPUT):
                expected = [shape[0] // 2, shape[1]]
            elif name.endswith(".weight") and any(part in name for part in SPLIT_BY_INPUT):
                expected = [shape[0], shape[1] // 2]
            else:  # the norms stay whole on every rank
                expected = shape
            assert held[name] == expected, (rank, name, held[name], shape)
    # the saved weights are the ranks' slices put together: the two ranks' sums, less the norms both hold whole
    replicated = sum(float(p.detach().double().sum()) for name, p in final.named_parameters() if "norm" in name)
    saved = sum(float(p.detach().double().sum()) for p in final.parameters())
    assert saved == pytest.approx(finished[0]["parameters_checksum"] + finished[1]["parameters_checksum"] - replicated,
                                  rel=1e-9, abs=1e-6)
    initial = AutoModelForCausalLM.from_pretrained(home / "models" / "demo")
    assert saved != pytest.approx(sum(float(p.detach().double().sum()) for p in initial.parameters()), rel=1e-6)

    # a batch the two ranks share is counted once: tokens seen per trained sample is a sample's length, not twice it
    finished_event = next(e for e in reversed(events) if e["event"] == "finished")
    per_sample = finished_event["num_input_tokens_seen"] / (finished_event["step"] * 16)  # demo-tp: 16 a step
    assert per_sample == pytest.approx(mean_sample_tokens(run_dir), rel=0.2)
    # the whole model computes what the tensor-parallel one reported
    reported = finished_event["eval_loss"]
    assert held_out_loss(run_dir, run_dir / "final") == pytest.approx(reported, rel=1e-5)
    checkpoint = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "checkpoint-15")
    assert {name: list(p.shape) for name, p in checkpoint.named_parameters()} == whole
    # DeepSpeed's CPU ranks talk through gloo: no C++ op compiled at start-up
    assert not extensions.exists() or not any(extensions.iterdir()), sorted(extensions.rglob("*"))


def test_fsdp_tp_loads_split_on_cpu_ranks_but_accelerate_refuses_to_train_there(tmp_path, demo_model_path):
    """The fsdp + tp path as far as CPU ranks take it: tuner's loading arguments make transformers split the model
    while loading (DistributedConfig), and the split model computes the whole model's loss; the Trainer then stops
    with Accelerate's refusal of a ParallelismConfig on CPU ranks (DistributedType.MULTI_CPU), which is why this path
    is GPU only. If Accelerate lifts that refusal, this test fails: then train it here for real."""
    import json
    import os
    import subprocess
    import sys

    import torch
    from transformers import AutoModelForCausalLM

    worker = Path(__file__).with_name("fsdp_tp_loading.py")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port()}", str(worker), str(tmp_path), str(demo_model_path)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    whole = AutoModelForCausalLM.from_pretrained(demo_model_path)
    ids = torch.arange(2, 34).reshape(2, 16) % whole.config.vocab_size
    with torch.no_grad():
        whole_loss = float(whole(input_ids=ids, labels=ids).loss)
    for rank in ranks:
        held = rank["shapes"]
        for name, parameter in whole.named_parameters():
            shape = list(parameter.shape)
            if any(part in name for part in SPLIT_BY_OUTPUT):
                shape[0] //= 2
            elif any(part in name for part in SPLIT_BY_INPUT):
                shape[1] //= 2
            assert held[name] == shape, (name, held[name])
        assert rank["loss"] == pytest.approx(whole_loss, rel=1e-5)
        assert "ParallelismConfig is only compatible" in rank["refused"] and "MULTI_CPU" in rank["refused"]
