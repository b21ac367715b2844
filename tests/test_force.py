"""``--force`` replaces what tuner wrote there, never the folder: render, merge and infer --output.

A destination that holds files tuner did not write, the run itself (its final/ or checkpoints/), the current
folder or a folder above it, and a symbolic link are refused with one message; what is replaced is written
into a fresh sibling first and swapped in; a re-render keeps the run's history.
"""
from __future__ import annotations

import json
import os
import stat

import pytest
from conftest import library_noise

from tuner.cli import main
from tuner.recipe.io import load_recipe, recipe_to_yaml
from tuner.recipe.registry import builtin_path
from tuner.render.run_directory import holds_only_rendered_files
from tuner.rundir.layout import CHECKPOINTS_DIR, EVENTS_FILE, FINAL_DIR, LOCK_FILE, LOG_FILE, MANIFEST, MERGED_DIR


def cli(capsys, *args: str) -> tuple[int, str]:
    code = main([str(arg) for arg in args])
    return code, capsys.readouterr().err


def hidden_leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, demo_model_path):
    """A LoRA run directory as training leaves it (an untrained adapter is enough to merge)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path_factory.mktemp("project") / "runs" / "lora"
    recipe = load_recipe(builtin_path("demo-lora"), ["model.dtype=float32", "memory.mixed_precision=no",
                                                     f"output.dir={run}"])
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(demo_model_path),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    (run / FINAL_DIR).mkdir(parents=True)
    model.save_pretrained(run / FINAL_DIR)
    AutoTokenizer.from_pretrained(demo_model_path).save_pretrained(run / FINAL_DIR)
    for folder in (run, run / FINAL_DIR):
        (folder / LOCK_FILE).write_text(recipe_to_yaml(recipe))
    (run / CHECKPOINTS_DIR / "checkpoint-2").mkdir(parents=True)
    (run / EVENTS_FILE).write_text('{"event": "finished"}\n')
    return run


# -- merge ---------------------------------------------------------------------------------------------------------

def test_merge_force_replaces_its_own_folder_and_nothing_else(lora_run, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "merged"
    code, err = cli(capsys, "merge", lora_run, "-o", out)
    assert code == 0 and not library_noise(err), err  # the loading bars: in the run's train.log
    written = json.loads((out / MANIFEST).read_text())
    assert "model.safetensors" in written["files"] and LOCK_FILE in written["files"]
    assert written["files"]["model.safetensors"]["size"] == (out / "model.safetensors").stat().st_size
    code, err = cli(capsys, "merge", lora_run, "-o", out)
    assert code == 2 and "--force" in err
    stale = out / "model.safetensors"
    os.utime(stale, ns=(0, 0))
    assert cli(capsys, "merge", lora_run, "-o", out, "--force")[0] == 0
    assert (out / "model.safetensors").stat().st_mtime_ns > 0  # swapped for the new model
    assert hidden_leftovers(tmp_path) == []  # neither the staging folder nor the old one is left behind
    (out / "model.safetensors").write_bytes(b"mine now")  # tuner's file, edited: the user's from now on
    code, err = cli(capsys, "merge", lora_run, "-o", out, "--force")
    assert code == 2 and "model.safetensors (changed since tuner wrote it)" in err
    assert (out / "model.safetensors").read_bytes() == b"mine now"


def test_merge_force_refuses_a_folder_with_files_tuner_did_not_write(lora_run, tmp_path, capsys) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    for name in ("thesis.tex", "data.csv", "notes.md"):
        (precious / name).write_text(name)
    code, err = cli(capsys, "merge", lora_run, "-o", precious, "--force")
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"error: {precious}: holds files tuner did not write (data.csv, notes.md, thesis.tex)")
    assert sorted(p.name for p in precious.iterdir()) == ["data.csv", "notes.md", "thesis.tex"]


def test_merge_force_refuses_a_folder_where_tuner_wrote_some_files_and_a_user_others(lora_run, tmp_path, capsys):
    out = tmp_path / "merged"
    code, err = cli(capsys, "merge", lora_run, "-o", out)
    assert code == 0 and not library_noise(err), err  # the loading bars: in the run's train.log
    (out / "README.md").write_text("my notes about this model")
    code, err = cli(capsys, "merge", lora_run, "-o", out, "--force")
    assert code == 2 and "(README.md)" in err
    assert (out / "README.md").read_text() == "my notes about this model"


@pytest.mark.parametrize("where", ["run", "final", "checkpoint", "above the run"])
def test_merge_force_refuses_the_run_itself(lora_run, capsys, where) -> None:
    target = {"run": lora_run, "final": lora_run / FINAL_DIR, "checkpoint": lora_run / CHECKPOINTS_DIR / "checkpoint-2",
              "above the run": lora_run.parent}[where]
    before = sorted(p.name for p in target.iterdir())
    code, err = cli(capsys, "merge", lora_run, "-o", target, "--force")
    assert code == 2 and err.startswith(f"error: {target}: ") and "Traceback" not in err
    assert "the run" in err
    assert sorted(p.name for p in target.iterdir()) == before
    assert (lora_run / FINAL_DIR / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("output", [".", "..", "sub/.."])
def test_merge_force_refuses_the_current_folder_and_those_above_it(lora_run, tmp_path, capsys, monkeypatch, output):
    cwd = tmp_path / "work"
    (cwd / "sub").mkdir(parents=True)
    (cwd / "mine.txt").write_text("mine")
    monkeypatch.chdir(cwd)
    code, err = cli(capsys, "merge", lora_run, "-o", output, "--force")
    assert code == 2 and err.startswith(f"error: {output}: ") and "current folder" in err, err
    assert (cwd / "mine.txt").read_text() == "mine"


def test_merged_model_files_follow_the_umask(lora_run, tmp_path, capsys) -> None:
    old = os.umask(0o022)
    try:
        assert cli(capsys, "merge", lora_run, "-o", tmp_path / "merged")[0] == 0
    finally:
        os.umask(old)
    out = tmp_path / "merged"
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


def test_a_symlinked_or_unwritable_output_is_one_clean_message(lora_run, tmp_path, capsys) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    code, err = cli(capsys, "merge", lora_run, "-o", link)
    assert code == 2 and err == f"error: {link}: is a symbolic link (to {real}); give the folder itself, or another.\n"
    code, err = cli(capsys, "merge", lora_run, "-o", "/proc/tuner-x")
    assert code == 1 and err.startswith("error: /proc/tuner-x: ") and ".tmp" not in err and "/." not in err, err
    code, err = cli(capsys, "render", "demo", "-o", link)
    assert code == 2 and err.startswith(f"error: {link}: is a symbolic link")


# -- render --------------------------------------------------------------------------------------------------------

def test_render_force_keeps_the_runs_history(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    deepspeed = ["--set", "hardware.num_processes=2", "--set", "memory.distributed=deepspeed",
                 "--set", "memory.zero_stage=2"]
    assert cli(capsys, "render", "demo", "-o", run, *deepspeed)[0] == 0
    history = {EVENTS_FILE: '{"event": "started"}\n', LOG_FILE: "step 1\n"}
    for name, text in history.items():
        (run / name).write_text(text)
    (run / CHECKPOINTS_DIR / "checkpoint-4").mkdir(parents=True)
    (run / FINAL_DIR).mkdir()
    (run / FINAL_DIR / "model.safetensors").write_bytes(b"weights")
    assert cli(capsys, "render", "demo", "-o", run, "--set", "training.seed=7", "--force")[0] == 0
    assert "seed: 7" in (run / LOCK_FILE).read_text()
    assert not (run / "deepspeed.json").exists()  # rendered before, not now: replaced by nothing
    for name, text in history.items():
        assert (run / name).read_text() == text
    assert (run / CHECKPOINTS_DIR / "checkpoint-4").is_dir()
    assert (run / FINAL_DIR / "model.safetensors").read_bytes() == b"weights"
    assert hidden_leftovers(run) == [] and hidden_leftovers(tmp_path) == []


def test_render_force_refuses_a_folder_that_is_not_a_run(tmp_path, capsys, monkeypatch) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "launch.sh").write_text("my own launcher")
    (project / "train.py").write_text("print('mine')")
    code, err = cli(capsys, "render", "demo", "-o", project, "--force")
    assert code == 2 and err.startswith(f"error: {project}: holds files tuner did not write (launch.sh, train.py)")
    assert (project / "launch.sh").read_text() == "my own launcher"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    code, err = cli(capsys, "render", "demo", "-o", ".", "--force")
    assert code == 2 and "current folder" in err and list((tmp_path / "empty").iterdir()) == []


def test_a_dry_run_folder_holds_only_rendered_files(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert not holds_only_rendered_files(run)
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    assert holds_only_rendered_files(run)
    (run / EVENTS_FILE).write_text("")
    assert not holds_only_rendered_files(run)  # a run has started here: its history is not a dry run's


# -- infer --output ------------------------------------------------------------------------------------------------

def test_infer_output_never_overwrites_its_input_or_a_file_tuner_did_not_write(tmp_path, demo_model_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "reverse\nabc"}) + "\n")
    args = ["infer", "--model", demo_model_path, "--max-new-tokens", "2", "--greedy"]
    code, err = cli(capsys, *args, "--input", prompts, "--output", prompts, "--force")
    assert code == 2 and err.startswith(f"error: --output {prompts}: is the --input file") and "Traceback" not in err
    assert prompts.read_text() == json.dumps({"prompt": "reverse\nabc"}) + "\n"
    other = tmp_path / "report.jsonl"
    other.write_text('{"my": "data"}\n')
    code, err = cli(capsys, *args, "--input", prompts, "--output", other, "--force")
    assert code == 2 and err.startswith(f"error: --output {other}: not an answers file tuner wrote")
    assert other.read_text() == '{"my": "data"}\n'
    code, err = cli(capsys, *args, "--input", prompts, "--output", tmp_path, "--force")
    assert code == 2 and err.startswith(f"error: --output {tmp_path}: is a folder")
    answers = tmp_path / "answers.jsonl"
    assert cli(capsys, *args, "--input", prompts, "--output", answers)[0] == 0
    assert cli(capsys, *args, "--input", prompts, "--output", answers, "--force")[0] == 0  # its own answers: replaced
    assert json.loads(answers.read_text())["line"] == 1
