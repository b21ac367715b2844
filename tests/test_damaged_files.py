"""Damaged files of a run (final/ model, tokenizer, chat template, adapter, checkpoints) are one message naming the
file and what is wrong, exit 2 (or 1 for the machine), never a traceback, and found before anything loads or
launches where the files alone can tell."""
from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from tuner.cli import main
from tuner.recipe.io import load_recipe, recipe_to_yaml
from tuner.recipe.registry import builtin_path
from tuner.render.run_directory import write_run_directory
from tuner.rundir.layout import CHECKPOINT_INFO, CHECKPOINTS_DIR, FINAL_DIR, LOCK_FILE

INFER = ["--prompt", "reverse\nabc", "--greedy", "--max-new-tokens", "2"]


def cli(capsys, *args) -> tuple[int, str]:
    code = main([str(arg) for arg in args])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory, demo_model_path):
    """A full run and a LoRA run as training leaves them, copied afresh for each damage."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("saved")
    full = write_run_directory(load_recipe(builtin_path("demo"), [f"output.dir={root / 'full'}"]))
    shutil.copytree(demo_model_path, full / FINAL_DIR)
    (full / FINAL_DIR / LOCK_FILE).write_text((full / LOCK_FILE).read_text())
    lora = write_run_directory(load_recipe(builtin_path("demo-lora"), [f"output.dir={root / 'lora'}"]))
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(demo_model_path),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    model.save_pretrained(lora / FINAL_DIR)
    AutoTokenizer.from_pretrained(demo_model_path).save_pretrained(lora / FINAL_DIR)
    (lora / FINAL_DIR / LOCK_FILE).write_text((lora / LOCK_FILE).read_text())
    return {"full": full, "lora": lora}


def copy_of(saved_runs, kind: str, tmp_path):
    run = tmp_path / kind
    shutil.copytree(saved_runs[kind], run, symlinks=True)
    lock = run / LOCK_FILE
    lock.write_text(lock.read_text().replace(str(saved_runs[kind]), str(run)))
    return run


def cut(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def json_edit(change):
    def damage(path) -> None:
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
    return damage


def safetensors_header(change):
    """Rewrite the header of a safetensors file, keeping its data."""
    def damage(path) -> None:
        raw = path.read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + length])
        change(header)
        text = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])
    return damage


def first_tensor(header) -> dict:
    return next(entry for name, entry in header.items() if name != "__metadata__")


DAMAGE = {  # (run, file in final/, damage, what the message says)
    "config-list": ("full", "config.json", lambda p: p.write_text("[]"), "holds a JSON list, not an object"),
    "config-deep": ("full", "config.json", lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "nested too deeply"),
    "config-cut": ("full", "config.json", cut, "truncated or damaged JSON"),
    "config-bogus-type": ("full", "config.json", json_edit(lambda d: d.update(model_type="bogus")), "cannot be loaded"),
    "config-type-number": ("full", "config.json", json_edit(lambda d: d.update(model_type=5)), "model_type"),
    "config-vocab-0": ("full", "config.json", json_edit(lambda d: d.update(vocab_size=0)), "cannot be loaded"),
    "config-hidden": ("full", "config.json", json_edit(lambda d: d.update(hidden_size=d["hidden_size"] * 2)),
                      "cannot be loaded"),
    "weights-cut": ("full", "model.safetensors", cut, "model.safetensors: truncated"),
    "weights-empty": ("full", "model.safetensors", lambda p: p.write_bytes(b""), "model.safetensors: truncated"),
    "weights-random": ("full", "model.safetensors", lambda p: p.write_bytes(os.urandom(4096)), "model.safetensors"),
    "weights-huge-header": ("full", "model.safetensors", lambda p: p.write_bytes(struct.pack("<Q", 10**18) + b"{}"),
                            "model.safetensors: truncated"),
    "weights-shape-lie": ("full", "model.safetensors",
                          safetensors_header(lambda h: first_tensor(h).update(shape=[7, 7])), "model.safetensors"),
    "tokenizer-cut": ("full", "tokenizer.json", cut, "tokenizer.json: truncated"),
    "tokenizer-garbage": ("full", "tokenizer.json", lambda p: p.write_bytes(b"\xff\xfe garbage"), "tokenizer.json"),
    "tokenizer-deleted": ("full", "tokenizer.json", lambda p: p.unlink(), "cannot be loaded"),
    "tokenizer-fifo": ("full", "tokenizer.json", lambda p: (p.unlink(), os.mkfifo(p)), "tokenizer.json: not a regular file (a pipe)"),
    "tokenizer-config-list": ("full", "tokenizer_config.json", lambda p: p.write_text("[1]"), "tokenizer_config.json"),
    "template-syntax": ("full", "chat_template.jinja", lambda p: p.write_text("{% if messages %}{{ x"),
                        "chat_template.jinja: the chat template does not compile"),
    "adapter-config-garbage": ("lora", "adapter_config.json", lambda p: p.write_text("garbage"), "adapter_config.json"),
    "adapter-config-empty": ("lora", "adapter_config.json", lambda p: p.write_text("{}"), "adapter_config.json"),
    "adapter-config-type": ("lora", "adapter_config.json", json_edit(lambda d: d.update(peft_type="BOGUS")),
                            "adapter_config.json: peft_type"),
    "adapter-config-rank": ("lora", "adapter_config.json", json_edit(lambda d: d.update(r=d["r"] * 2)),
                            "cannot apply the adapter"),
    "adapter-weights-cut": ("lora", "adapter_model.safetensors", cut, "adapter_model.safetensors: truncated"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_final_model_is_one_message_naming_the_file(case, saved_runs, tmp_path, capsys):
    kind, name, damage, said = DAMAGE[case]
    run = copy_of(saved_runs, kind, tmp_path)
    damage(run / FINAL_DIR / name)
    code, err = cli(capsys, "infer", run, *INFER)
    assert code in (1, 2) and "Traceback" not in err, err
    (message,) = [line for line in err.splitlines() if line.startswith("error: ")]  # after loading's progress, if any
    assert said in message and str(run) in message, err


CHECKPOINT_DAMAGE = {  # what is written where in a checkpoint that otherwise looks complete
    "info-empty": (CHECKPOINT_INFO, "{}"),
    "info-wrong-types": (CHECKPOINT_INFO, json.dumps({"settings": [1], "files": "all"})),
    "info-deep": (CHECKPOINT_INFO, "[" * 100_000 + "]" * 100_000),
    "info-not-utf8": (CHECKPOINT_INFO, b"\xff\xfe{}"),
    "state-deep": ("trainer_state.json", "{\"a\":" * 50_000 + "1" + "}" * 50_000),
    "index-wrong-types": ("model.safetensors.index.json", json.dumps({"weight_map": [1, 2]})),
    "index-escapes": ("model.safetensors.index.json", json.dumps({"weight_map": {"w": "../../../etc/passwd"}})),
}


def damaged_checkpoint(run, name, text):
    from tuner.rundir.checkpoints import resume_settings

    checkpoint = run / CHECKPOINTS_DIR / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    recipe = load_recipe(run / LOCK_FILE)
    files = {"trainer_state.json": "{}", "model.safetensors": b"\x02\x00\x00\x00\x00\x00\x00\x00{}",
             LOCK_FILE: recipe_to_yaml(recipe),
             CHECKPOINT_INFO: json.dumps({"step": 2, "settings": resume_settings(recipe, 1)})}
    files[name] = text
    for file, content in files.items():
        (checkpoint / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    return checkpoint


@pytest.mark.parametrize("case", sorted(CHECKPOINT_DAMAGE))
def test_a_damaged_checkpoint_is_skipped_on_resume_and_refused_when_named(case, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    checkpoint = damaged_checkpoint(run, *CHECKPOINT_DAMAGE[case])
    code, err = cli(capsys, "run", run / LOCK_FILE, "--resume", "--dry-run")
    assert code == 0 and "Traceback" not in err, err
    assert f"skipping {checkpoint}: " in err and "starting from the beginning" in err, err
    code, err = cli(capsys, "run", run / LOCK_FILE, "--set", f"training.resume={checkpoint}", "--dry-run")
    assert code == 2 and err.startswith(f"error: training.resume: {checkpoint}") and "Traceback" not in err, err


def test_an_explicitly_named_damaged_checkpoint_is_refused_before_launch(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    checkpoint = damaged_checkpoint(run, "model.safetensors", b"\x02\x00\x00\x00\x00\x00\x00\x00{}" + b"x")
    lock_before = (run / LOCK_FILE).read_text()
    code, err = cli(capsys, "run", run / LOCK_FILE, "--set", f"training.resume={checkpoint}", "--force")
    assert code == 2 and f"training.resume: {checkpoint}: model.safetensors: damaged header" in err, err
    assert "launching" not in err and (run / LOCK_FILE).read_text() == lock_before


@pytest.mark.parametrize("argument, said", [
    (["--max-memory", "cpu=infGiB"], "--max-memory"), (["--max-memory", "cpu=-1GiB"], "--max-memory"),
    (["--max-memory", "3=1GiB"], "--max-memory 3=...: this machine has"),
])
def test_inference_arguments_that_cannot_hold_are_refused(argument, said, demo_model_path, capsys):
    try:
        code, err = cli(capsys, "infer", "--model", demo_model_path, *INFER, *argument)
    except SystemExit as exit:  # argparse's own usage error
        code, err = exit.code, capsys.readouterr().err
    assert code == 2 and said in err and "Traceback" not in err, err


@pytest.mark.parametrize("model, said", [("builtin:x", "model.id: unknown built-in model 'builtin:x'"),
                                         ("~nouser/model", "model.id: ~nouser/model: no such directory")])
def test_model_ids_that_name_nothing_are_one_message(model, said, capsys):
    code, err = cli(capsys, "infer", "--model", model, *INFER)
    assert code == 2 and said in err and "Traceback" not in err, err


@pytest.mark.parametrize("case", ["adapter-config-empty", "adapter-weights-cut", "adapter-config-rank"])
def test_merge_of_a_damaged_adapter_is_one_message(case, saved_runs, tmp_path, capsys):
    _, name, damage, said = DAMAGE[case]
    run = copy_of(saved_runs, "lora", tmp_path)
    damage(run / FINAL_DIR / name)
    code, err = cli(capsys, "merge", run)
    assert code == 2 and "Traceback" not in err, err
    (message,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert said.replace("cannot apply the adapter", "cannot apply the adapter to its base model") in message, err
    assert not (run / "merged").exists()
