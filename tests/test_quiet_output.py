"""Quiet where a user reads: the libraries' own output goes to the run's log (tuner.rundir.library_output), and a
progress view off a terminal prints whole lines at an interval (tuner.launch.progress)."""
from __future__ import annotations

import io
import logging
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tuner.launch.progress import PLAIN_EVERY_S, ProgressView
from tuner.rundir.events import parse_event
from tuner.rundir.library_output import output_to_log


def test_library_output_of_every_kind_goes_to_the_log_not_the_terminal(tmp_path, capfd) -> None:
    """Python's streams, logging's last resort (bitsandbytes' kernels notice), a tqdm bar, and a subprocess writing
    to the inherited descriptor (lm-eval's `git describe` outside a repository): all in the log, none on the
    terminal; the terminal is whole again after the block, also when it raises."""
    from tqdm import tqdm

    log = tmp_path / "train.log"
    log.write_text("the ranks' lines\n")
    with output_to_log(log):
        print("printed")
        sys.stderr.write("written to stderr\n")
        # what logging does with a library's warning where nobody configured a handler (pytest configures one)
        logging.lastResort.handle(logging.makeLogRecord(
            {"name": "bitsandbytes", "levelno": logging.WARNING, "msg": "Failed to load CPU gemm_4bit_forward"}))
        for _ in tqdm(range(3), desc="Loading weights"):
            pass
        subprocess.run(["git", "describe", "--always"], cwd=tmp_path)  # git's own "fatal: not a git repository"
    try:
        with output_to_log(log):
            raise ValueError("the message the user reads")
    except ValueError:
        print("tuner's line")
    out, err = capfd.readouterr()
    assert out == "tuner's line\n" and err == ""
    text = log.read_text()
    assert text.startswith("the ranks' lines\n")  # appended, never replaced
    for said in ("printed", "written to stderr", "gemm_4bit_forward", "Loading weights", "fatal: not a git"):
        assert said in text, said


def test_verbose_keeps_the_terminal(tmp_path, capfd) -> None:
    with output_to_log(tmp_path / "train.log", shown=True):
        print("shown")
    assert capfd.readouterr().out == "shown\n" and not (tmp_path / "train.log").exists()


def step(number: int, last: int = 1000, kind: str = "step") -> dict:
    return {"event": kind, "step": number, "max_steps": last, "loss": 1.25, "tokens_per_s": 123.4, "eta_s": 166,
            "reward": 0.5, "kl": 0.01, "completions/mean_length": 6.5}


@settings(max_examples=50, deadline=None)
@given(gaps=st.lists(st.floats(0, 3 * PLAIN_EVERY_S), min_size=1, max_size=30), width=st.integers(20, 120))
def test_off_a_terminal_progress_is_whole_lines_at_an_interval(gaps, width) -> None:
    """Any rhythm of steps, any console width: each printed line is one whole step line (never a fragment such as
    '123 tok/s  eta 166s' on a line of its own), the first and last steps are printed, and two step lines are never
    closer than the interval."""
    out, now = io.StringIO(), [0.0]
    view = ProgressView(Console(file=out, width=width), clock=lambda: now[0])
    printed_at = []
    last = len(gaps)
    for number, gap in enumerate(gaps, 1):
        now[0] += gap
        before = out.getvalue().count("\n")
        view.update([parse_event(step(number, last))])
        if out.getvalue().count("\n") > before:
            printed_at.append((number, now[0]))
    lines = out.getvalue().splitlines()
    assert all(line.startswith("step ") and line.endswith("eta 166s") for line in lines), lines
    assert printed_at[0][0] == 1 and printed_at[-1][0] == last
    times = [at for number, at in printed_at if number != last]
    assert all(b - a >= PLAIN_EVERY_S for a, b in zip(times, times[1:]))


def test_an_evaluation_is_always_printed() -> None:
    out = io.StringIO()
    view = ProgressView(Console(file=out, width=80), clock=lambda: 0.0)
    view.update([parse_event(step(1)), parse_event(step(2)), parse_event({**step(2, kind="eval"), "eval_loss": 2.5})])
    assert [line.split()[:2] for line in out.getvalue().splitlines()] == [["step", "1/1000"], ["step", "2/1000"]]
    assert "eval_loss 2.5000" in out.getvalue().splitlines()[-1]


def test_scoring_starts_no_process(demo_model_path, tmp_path, monkeypatch, capfd) -> None:
    """lm-eval's simple_evaluate adds an environment report (torch's collect_env runs pip, nvidia-smi, lscpu ...:
    seconds a call) and git probes to results tuner does not keep: scoring a model spawns nothing, and prints no git
    error, from a folder that is no repository."""
    from tuner.evaluate.evaluation import score_model
    from tuner.infer.target import InferenceTarget
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_path

    spawned, watching = [], [True]
    sys.addaudithook(lambda event, args: spawned.append(args[0]) if watching[0] and event in (
        "subprocess.Popen", "os.posix_spawn", "os.exec") else None)
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(builtin_path("demo-grpo"), ["model.id=builtin:demo"])
    try:
        result = score_model("base", InferenceTarget(recipe, str(demo_model_path), str(demo_model_path)), limit=4)
    finally:
        watching[0] = False
    assert spawned == [] and "fatal" not in capfd.readouterr().err
    assert set(result.scores["held_out"]) >= {"reward", "exact_match(answer)"} and len(result.examples) == 4


def test_the_log_of_a_command_without_a_run_is_bounded(tmp_path, monkeypatch, capfd) -> None:
    """A model that is no run's: its libraries' output goes to $TUNER_HOME/logs/libraries.log, which past its bound
    is moved aside once (one older log kept), so loading models for months never fills the home."""
    from tuner.rundir.library_output import LIBRARY_LOG, LIBRARY_LOG_BYTES, libraries_to_log

    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    log = tmp_path / LIBRARY_LOG
    with libraries_to_log(None):
        print("first load")
    assert log.read_text() == "first load\n"
    log.write_bytes(b"x" * (LIBRARY_LOG_BYTES + 1))
    with libraries_to_log(None):
        print("next load")
    assert log.read_text() == "next load\n" and log.with_name("libraries.log.1").stat().st_size > LIBRARY_LOG_BYTES
    (tmp_path / "run").mkdir()
    with libraries_to_log(tmp_path / "run"):  # a run's: its train.log
        print("a run's load")
    assert (tmp_path / "run" / "train.log").read_text() == "a run's load\n" and capfd.readouterr() == ("", "")
    with libraries_to_log(None, shown=True):
        print("shown")
    assert capfd.readouterr().out == "shown\n"
