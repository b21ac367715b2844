"""Every folder tuner writes into is guarded the same way, in every mode: a symbolic link is never followed out of
the folder tuner owns, and a name is replaced only when it is one tuner writes there, of the kind tuner writes
(a file, a folder, a link).  The user's own files survive `serve`, `run --resume`, `run --dry-run`, `render
--force`, `recipes cp --force`; a writer of a run directory holds its lock."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest

from tuner.cli import main
from tuner.infer.target import resolve_target
from tuner.loading.model import ModelLoadError
from tuner.recipe.io import load_recipe, recipe_to_yaml
from tuner.recipe.registry import builtin_path
from tuner.render.run_directory import write_run_directory
from tuner.rundir.lock import RunLocked, lock_path
from tuner.rundir.layout import ACCELERATE_CONFIG, FINAL_DIR, LAUNCH_SCRIPT, LOCK_FILE, SERVE_DIR

USER_FILES = {"config.json": '{"mine": true}', "tokenizer.json": '{"mine": true}', "notes.md": "my notes"}


def cli(capsys, *args) -> tuple[int, str]:
    code = main([str(arg) for arg in args])
    return code, capsys.readouterr().err


def user_folder(path):
    path.mkdir(parents=True)
    for name, text in USER_FILES.items():
        (path / name).write_text(text)
    return path


def assert_untouched(path) -> None:
    assert sorted(entry.name for entry in path.iterdir()) == sorted(USER_FILES), list(path.iterdir())
    for name, text in USER_FILES.items():
        assert not (path / name).is_symlink() and (path / name).read_text() == text, name


@pytest.fixture
def full_run(tmp_path, demo_model_path):
    """A finished full fine-tuning run: the demo model (links to its files) in final/, beside the lock."""
    recipe = load_recipe(builtin_path("demo"), [f"output.dir={tmp_path / 'run'}"])
    run = write_run_directory(recipe)
    (run / FINAL_DIR).mkdir()
    for path in demo_model_path.iterdir():
        shutil.copyfile(path, run / FINAL_DIR / path.name)
    (run / FINAL_DIR / LOCK_FILE).write_text(recipe_to_yaml(recipe))
    return run


# -- serve/ ---------------------------------------------------------------------------------------------------------

def test_serve_never_follows_a_serve_link_into_the_users_folder(full_run, tmp_path):
    from tuner.infer.serve import serving_folder

    victim = user_folder(tmp_path / "victim")
    (full_run / SERVE_DIR).symlink_to(victim)
    with pytest.raises(ModelLoadError, match=rf"{SERVE_DIR}: is a symbolic link"):
        serving_folder(resolve_target(str(full_run)))
    assert_untouched(victim)


def test_serve_keeps_a_folder_named_like_its_chat_template(full_run):
    from tuner.infer.serve import CHAT_TEMPLATE_FILE, serving_folder

    mine = full_run / SERVE_DIR / CHAT_TEMPLATE_FILE
    mine.mkdir(parents=True)
    (mine / "draft.jinja").write_text("{{ mine }}")
    with pytest.raises(ModelLoadError, match=rf"holds files tuner did not write \({CHAT_TEMPLATE_FILE} \("):
        serving_folder(resolve_target(str(full_run)))
    assert (mine / "draft.jinja").read_text() == "{{ mine }}"


@pytest.mark.parametrize("edited", [False, True], ids=["users-own", "tuners-then-edited"])
def test_serve_never_replaces_a_chat_template_it_cannot_prove_it_wrote(full_run, edited):
    """By content, not by name: the user's own chat_template.jinja in serve/ (or tuner's, edited since) is kept."""
    from tuner.infer.serve import CHAT_TEMPLATE_FILE, serving_folder, write_chat_template
    from tuner.loading.model import load_tokenizer

    target = resolve_target(str(full_run))
    serve = full_run / SERVE_DIR
    serve.mkdir()
    mine = serve / CHAT_TEMPLATE_FILE
    if edited:  # tuner wrote it (recorded in the folder's manifest), then the user changed it
        write_chat_template(serve, load_tokenizer(target.recipe, target.tokenizer_path), target.recipe.data.format)
        mine.write_text(mine.read_text() + "{# mine #}")
    else:
        mine.write_text("{{ mine }}")
    before = mine.read_bytes()
    with pytest.raises(ModelLoadError, match=rf"holds files tuner did not write \({CHAT_TEMPLATE_FILE}"):
        serving_folder(target)
    assert mine.read_bytes() == before


def test_serve_rebuilds_a_chat_template_it_proves_it_wrote(full_run):
    from tuner.infer.serve import CHAT_TEMPLATE_FILE, serving_folder, write_chat_template
    from tuner.loading.model import load_tokenizer

    target = resolve_target(str(full_run))
    serve = full_run / SERVE_DIR
    serve.mkdir()
    write_chat_template(serve, load_tokenizer(target.recipe, target.tokenizer_path), target.recipe.data.format)
    assert serving_folder(target).path == serve and (serve / CHAT_TEMPLATE_FILE).exists()


def test_serve_rebuilds_its_own_folder_and_leaves_link_targets_alone(full_run):
    from tuner.infer.serve import serving_folder

    first = serving_folder(resolve_target(str(full_run)))
    linked = {entry.name: entry.resolve() for entry in first.path.iterdir() if entry.is_symlink()}
    assert linked and all(target.is_file() for target in linked.values())
    again = serving_folder(resolve_target(str(full_run)))  # rebuilt: the links go, what they point at stays
    assert all(target.is_file() for target in linked.values())
    assert sorted(entry.name for entry in again.path.iterdir()) == sorted(entry.name for entry in first.path.iterdir())


def test_print_vllm_never_writes_its_chat_template_through_a_serve_link(full_run, tmp_path, capsys):
    from tuner.infer.serve import CHAT_TEMPLATE_FILE

    (full_run / FINAL_DIR / CHAT_TEMPLATE_FILE).unlink()  # the run's prompt format is written beside it
    victim = user_folder(tmp_path / "victim")
    (full_run / SERVE_DIR).symlink_to(victim)
    code, err = cli(capsys, "serve", full_run, "--print", "vllm", "--gpus", "1xA100-80GB")
    assert code == 2 and f"{full_run / SERVE_DIR}: is a symbolic link" in err and "Traceback" not in err
    assert_untouched(victim)


def test_infer_never_offloads_weights_through_an_offload_link(full_run, tmp_path, capsys):
    victim = user_folder(tmp_path / "victim")
    (full_run / "offload").symlink_to(victim)
    code, err = cli(capsys, "infer", full_run, "--prompt", "reverse\nabc", "--max-new-tokens", "2")
    assert code == 2 and f"{full_run / 'offload'}: is a symbolic link" in err and "Traceback" not in err, err
    assert_untouched(victim)


# -- run directories, in every mode -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [["--resume", "--dry-run"], ["--resume"], ["--dry-run"], ["--force", "--dry-run"],
                                  ["--resume", "--force", "--dry-run"]])
def test_run_refuses_a_folder_of_user_files_in_every_mode(mode, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "v"
    folder.mkdir()
    mine = {LAUNCH_SCRIPT: "my launcher", ACCELERATE_CONFIG: "my config", "thesis.tex": "years of work"}
    for name, text in mine.items():
        (folder / name).write_text(text)
    code, err = cli(capsys, "run", "demo", "--set", f"output.dir={folder}", *mode)
    assert code == 2 and err.startswith(f"error: {folder}: holds files tuner did not write (accelerate.yaml, "
                                        "launch.sh, thesis.tex)"), err
    assert {path.name: path.read_text() for path in folder.iterdir()} == mine


@pytest.mark.parametrize("name, kind", [(LAUNCH_SCRIPT, "folder"), ("checkpoints", "file"), ("events.jsonl", "link"),
                                        ("final", "link")])
def test_a_tuner_name_of_another_kind_is_refused(name, kind, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    elsewhere = user_folder(tmp_path / "elsewhere")
    target = run / name
    target.unlink(missing_ok=True)
    if kind == "folder":
        target.mkdir()
        (target / "mine.txt").write_text("mine")
    elif kind == "file":
        target.write_text("mine")
    else:
        target.symlink_to(elsewhere)
    for args in (["render", "demo", "-o", run, "--force"], ["run", "demo", "--set", f"output.dir={run}", "--resume",
                                                          "--dry-run"]):
        code, err = cli(capsys, *args)
        assert code == 2 and f"{run}: holds files tuner did not write ({name}" in err, err
    assert_untouched(elsewhere)
    assert (target / "mine.txt").read_text() == "mine" if kind == "folder" else True


def test_resume_from_a_lock_refuses_an_output_dir_elsewhere(tmp_path, capsys, monkeypatch):
    """A lock recipe names its own run directory: resuming it writes there, not wherever output.dir points."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "a"
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    other = tmp_path / "runs" / "b"
    assert cli(capsys, "render", "demo", "-o", other, "--set", "training.seed=9")[0] == 0
    before = {path.name: path.read_text() for path in other.iterdir()}
    lock = run / LOCK_FILE
    lock.write_text(lock.read_text().replace(f"dir: {run}", f"dir: {other}"))
    code, err = cli(capsys, "run", lock, "--resume", "--dry-run")
    assert code == 2 and f"output.dir: {other} is not the run directory of {lock}" in err, err
    assert {path.name: path.read_text() for path in other.iterdir()} == before


# -- the run lock --------------------------------------------------------------------------------------------------

@pytest.fixture
def another_tuner():
    """A live process of this user standing for a tuner that holds a run directory."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def hold(run, process) -> None:
    lock_path(run).write_text(json.dumps({"pid": process.pid, "host": os.uname().nodename,
                                          "started": psutil.Process(process.pid).create_time()}))


def test_render_force_waits_for_the_tuner_that_holds_the_run(tmp_path, capsys, another_tuner):
    run = tmp_path / "run"
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    before = (run / LOCK_FILE).read_text()
    hold(run, another_tuner)
    code, err = cli(capsys, "render", "demo", "-o", run, "--force", "--set", "training.learning_rate=0.5")
    assert code == 2 and f"another tuner (pid {another_tuner.pid}) is using this run directory" in err, err
    assert (run / LOCK_FILE).read_text() == before
    assert lock_path(run).exists(), "the other tuner's lock is left alone"


def test_serve_waits_for_the_tuner_that_holds_the_run(full_run, another_tuner):
    from tuner.infer.serve import serving_folder

    hold(full_run, another_tuner)
    with pytest.raises(RunLocked, match="another tuner"):
        serving_folder(resolve_target(str(full_run)))
    assert not (full_run / SERVE_DIR).exists()


@pytest.mark.parametrize("started", ['"yesterday"', "[1]", '{"a": 1}', "true", "1e400", "-1e308"])
def test_a_lock_with_a_damaged_start_time_is_judged_by_its_pid(started, tmp_path, capsys, another_tuner):
    run = tmp_path / "run"
    run.parent.mkdir(parents=True, exist_ok=True)
    lock_path(run).write_text(f'{{"pid": {another_tuner.pid}, "host": "{os.uname().nodename}", "started": {started}}}')
    code, err = cli(capsys, "run", "demo", "--set", f"output.dir={run}", "--dry-run")
    assert code == 2 and f"another tuner (pid {another_tuner.pid}) is using this run directory" in err, err


def test_a_lock_that_is_a_pipe_is_refused_without_waiting(tmp_path, capsys):
    run = tmp_path / "run"
    os.mkfifo(lock_path(run))
    code, err = cli(capsys, "run", "demo", "--set", f"output.dir={run}", "--dry-run")
    assert code == 2 and f"{lock_path(run)}: not a lock file tuner wrote (a pipe)" in err, err


# -- recipes cp ----------------------------------------------------------------------------------------------------

def test_recipes_cp_force_replaces_a_file_never_a_link_or_a_folder(tmp_path, capsys):
    elsewhere = user_folder(tmp_path / "elsewhere")
    link = tmp_path / "link.yaml"
    link.symlink_to(elsewhere / "notes.md")
    code, err = cli(capsys, "recipes", "cp", "demo", link, "--force")
    assert code == 2 and f"{link}: is a symbolic link" in err, err
    folder = tmp_path / "out"
    (folder / "demo.yaml").mkdir(parents=True)
    code, err = cli(capsys, "recipes", "cp", "demo", folder, "--force")  # into the folder: its demo.yaml is one
    assert code == 2 and "is a folder" in err and "Traceback" not in err, err
    assert_untouched(elsewhere)
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\n")
    assert cli(capsys, "recipes", "cp", "demo", mine)[0] == 2
    assert cli(capsys, "recipes", "cp", "demo", mine, "--force")[0] == 0 and "name: demo" in mine.read_text()


# -- --force over an earlier run -----------------------------------------------------------------------------------

SMALL = ["data.max_samples=64", "data.eval_fraction=0", "training.micro_batch_size=8", "training.warmup_steps=0",
         "training.logging_steps=1", "training.save_steps=2"]


@pytest.mark.slow
def test_force_over_an_earlier_run_moves_it_aside_and_resume_never_mixes_the_two(tmp_path):
    """The earlier run (checkpoints 2 and 4) survives a new run with --force in its directory (whose checkpoint
    rotation would delete them), the new events are the new run's alone, and a resume takes the new checkpoint-2,
    never the earlier run's newer checkpoint-4."""
    from tuner.rundir.events import read_records
    from tuner.rundir.checkpoints import checkpoint_states
    from tuner.launch.run import RunRefused, prepare_run
    from tuner.rundir.layout import CHECKPOINTS_DIR, EVENTS_FILE, PREVIOUS_RUNS_DIR
    from tuner.train.__main__ import main as train_main

    run = tmp_path / "run"
    earlier = load_recipe(builtin_path("demo"), [*SMALL, "training.max_steps=4", f"output.dir={run}"])
    write_run_directory(earlier)
    assert train_main([str(run / LOCK_FILE)]) == 0
    earlier_events = read_records(run / EVENTS_FILE)
    later = load_recipe(builtin_path("demo"), [*SMALL, "training.max_steps=2", "training.save_total_limit=1",
                                                "training.seed=7", f"output.dir={run}"])
    with pytest.raises(RunRefused, match="moves the earlier run's checkpoints, events and log"):
        prepare_run(later)
    assert (run / CHECKPOINTS_DIR / "checkpoint-4").is_dir(), "a refusal moves nothing"

    prepared = prepare_run(later, force=True)
    prepared.release()
    aside = run / PREVIOUS_RUNS_DIR / "1"
    assert f"the earlier run in {run} was moved to {aside}" in prepared.notes
    assert train_main([str(run / LOCK_FILE)]) == 0
    assert [path.name for path, _ in checkpoint_states(aside / CHECKPOINTS_DIR)] == ["checkpoint-4", "checkpoint-2"]
    assert all(problem is None for _, problem in checkpoint_states(aside / CHECKPOINTS_DIR)), "kept whole"
    assert read_records(aside / EVENTS_FILE) == earlier_events
    assert "seed: 42" in (aside / LOCK_FILE).read_text(), "the recipe the earlier run was trained under"
    events = read_records(run / EVENTS_FILE)
    assert [event["event"] for event in events].count("started") == 1 and events[-1]["step"] == 2

    resumed = prepare_run(later, resume=True, dry_run=True)
    assert resumed.notes[-1] == f"resuming from {run / CHECKPOINTS_DIR / 'checkpoint-2'}"


def test_a_probe_folder_stays_the_probes_through_reprobes_and_a_forced_run(tmp_path):
    """What a probe leaves (its folder's events, log and report, the lock a kill left beside it) is tuner's: a second
    probe prepares in the same folder without moving anything aside, and a run --force over an earlier run moves that
    run's outputs aside but leaves the probe it was just measured by."""
    from tuner.launch.probe import probe_recipe
    from tuner.launch.run import prepare_run
    from tuner.rundir.manifest import amend
    from tuner.rundir.layout import EVENTS_FILE, LOG_FILE, PREVIOUS_RUNS_DIR, PROBE_DIR, PROBE_REPORT, PROBE_REQUEST

    run = tmp_path / "run"
    recipe = load_recipe(builtin_path("demo"), [f"output.dir={run}"])
    probe = probe_recipe(recipe)
    prepare_run(probe).release()  # a first probe, before the run directory has anything else
    for name in (PROBE_REQUEST, PROBE_REPORT, EVENTS_FILE, LOG_FILE):
        (run / PROBE_DIR / name).write_text("{}\n")
    amend(run / PROBE_DIR, written=[PROBE_REQUEST, PROBE_REPORT])  # as the probe records what it wrote
    prepare_run(probe).release()
    assert not (run / PROBE_DIR / PREVIOUS_RUNS_DIR).exists()
    lock_path(run / PROBE_DIR).write_text("{}")  # a killed probe's
    write_run_directory(recipe, force=True)  # the run's own files beside its probe
    (run / EVENTS_FILE).write_text("{}\n")  # an earlier run
    prepared = prepare_run(recipe, force=True)
    prepared.release()
    assert (run / PREVIOUS_RUNS_DIR / "1" / EVENTS_FILE).is_file() and (run / PROBE_DIR / PROBE_REPORT).is_file()
