"""The wizard in a real terminal: start ``python -m tuner`` under tmux, move through it, quit."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

import yaml

from conftest import REPO
from tui_helpers import SIZES
from tuner.recipe.registry import builtin_names, builtin_path

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


class Tmux:
    """One detached tmux session on a private server socket (never the user's own server)."""

    def __init__(self, command: str, cwd, size=(120, 36)):
        self.socket = f"tuner-test-{uuid.uuid4().hex[:8]}"
        self.session = "tuner"
        self.seen: list[str] = []  # every pane captured: what was ever on the screen
        self._tmux("new-session", "-d", "-s", self.session, "-x", str(size[0]), "-y", str(size[1]),
                   "-c", str(cwd), command)

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=check)

    def screen(self) -> str:
        shown = self._tmux("capture-pane", "-p", "-t", self.session, check=False).stdout
        self.seen.append(shown)
        return shown

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.session, *keys)

    def wait_for(self, *texts: str, timeout: float = 30) -> str:
        """The pane once it shows every one of ``texts`` (a screen paints in several updates)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(text in screen for text in texts):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{texts!r} never all appeared; the pane shows:\n{self.screen()}")

    def wait_gone(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text not in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never went away; the pane shows:\n{self.screen()}")

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", self.session, check=False).returncode == 0

    def close(self) -> None:
        self._tmux("kill-server", check=False)


def wizard(cwd, tuner_home, size=(120, 36)) -> Tmux:
    """``python -m tuner`` in a fresh tmux pane of ``size``."""
    env = {"PYTHONPATH": str(REPO), "TUNER_HOME": str(tuner_home), "TERM": "xterm-256color", "HF_HUB_OFFLINE": "1"}
    exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
    # the shell stays after tuner exits so the test can read its exit status from the pane
    # COLUMNS/LINES from the test runner's terminal would override the pane's real size
    command = f"env -u COLUMNS -u LINES {exports} {shlex.quote(sys.executable)} -m tuner; echo tuner-exited-$?; sleep 30"
    return Tmux(command, cwd, size)


# quitting takes about 3 s on an idle machine (the data preview's libraries unload); five helpers' tests on two
# cores make that over 15 s, so the walks wait for the exit status as long as for a screen
QUIT_TIMEOUT = 60


def save_and_quit(tmux: Tmux, path, timeout: float = 30) -> None:
    """On Review: ctrl+s, until ``path`` is written, then ctrl+q, until the wizard has exited cleanly."""
    tmux.keys("C-s")
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} was never written; the pane shows:\n{tmux.screen()}")
        time.sleep(0.2)
    tmux.keys("C-q")
    tmux.wait_for("tuner-exited-0", timeout=QUIT_TIMEOUT)


@SIZES
def test_dpo_from_scratch_in_a_terminal_saves_exactly_what_was_chosen(tmp_path, tuner_home, size):
    tmux = wizard(tmp_path, tuner_home, size)
    try:
        tmux.wait_for("New recipe", "Built-in recipe: demo")
        tmux.keys("Enter")  # New recipe
        tmux.wait_for("Architecture", "builtin:demo")
        tmux.keys("C-n")
        tmux.wait_for("GPUs per machine")
        tmux.keys("C-n")
        tmux.wait_for("Memory plan", "Objective", "dpo")
        # method, LoRA rank, alpha, dropout, targets, Auto-fit's toggle: the objective (keys handled in the order sent)
        tmux.keys(*["Tab"] * 6, "Right", "Enter")  # sft -> dpo
        tmux.wait_for("Beta", "reference model")  # dpo's settings, and its frozen reference in the plan
        tmux.keys("C-n")
        tmux.wait_for("builtin:reverse-pairs", "format: preference", timeout=120)  # its example data, read as pairs
        tmux.keys("C-n")
        tmux.wait_for("Learning rate")
        tmux.keys("C-n")
        tmux.wait_for("Save as", "recipe.lock.yaml")
        save_and_quit(tmux, tmp_path / "run.yaml")
    finally:
        tmux.close()
    assert yaml.safe_load((tmp_path / "run.yaml").read_text()) == {
        "version": 2, "objective": {"kind": "dpo"}, "data": {"source": "builtin:reverse-pairs"}}  # no RAM unchosen


@SIZES
def test_an_opened_built_in_recipe_saves_only_the_edit_in_a_terminal(tmp_path, tuner_home, size):
    name = "llama3.1/70b-qlora"
    tmux = wizard(tmp_path, tuner_home, size)
    try:
        tmux.wait_for("New recipe", "Built-in recipe: demo")
        tmux.keys(*["Down"] * (3 + builtin_names().index(name)))  # past New, Open and Chat
        tmux.wait_for(f"Built-in recipe: {name}")
        tmux.keys("Enter")
        tmux.wait_for("Architecture", "meta-llama/Llama-3.1-70B-Instruct")
        tmux.keys("C-n")
        tmux.wait_for("Host RAM (GiB)")
        # machines, GPUs, GPU type, GPU memory, processes: host RAM; in one burst with the digits, which go where the
        # tabs lead (they reached Machines, 1512 machines, every time, before keys were handled in order)
        tmux.keys("Tab", "Tab", "Tab", "Tab", "Tab", "5", "1", "2")
        tmux.wait_for("512")
        for screen in ("Memory plan", "Source", "Learning rate", "Save as"):
            tmux.keys("C-n")
            tmux.wait_for(screen)
        save_and_quit(tmux, tmp_path / "llama3.1-70b-qlora.yaml")
    finally:
        tmux.close()
    original = builtin_path(name).read_text()
    expected = original.replace("  gpu: H100-80GB\n", "  gpu: H100-80GB\n  host_ram_gb: 512\n")
    assert expected != original
    assert (tmp_path / "llama3.1-70b-qlora.yaml").read_text() == expected  # comments, order, 1.0e-4: as written


def test_start_navigate_and_quit_in_tmux(tmp_path, tuner_home):
    tmux = wizard(tmp_path, tuner_home)
    try:
        tmux.wait_for("New recipe", "Recent runs", "Built-in recipe: demo", "none yet under runs/")
        tmux.keys("Enter")  # New recipe
        tmux.wait_for("Architecture", "builtin:demo", "1 Model", "hidden size      128")
        tmux.keys("C-n")
        tmux.wait_for("GPUs per machine", "This machine")
        tmux.keys("C-n")
        tmux.wait_for("Memory plan", "Gradient checkpointing", "ZeRO-2", "Auto-fit")
        tmux.keys("?")
        tmux.wait_for("tuner: keys")
        tmux.keys("Escape")  # a lone ESC: the next key must wait, or the pair reads as alt+key
        tmux.wait_gone("tuner: keys")
        tmux.keys("C-q")
        tmux.wait_for("tuner-exited-0", timeout=QUIT_TIMEOUT)
    finally:
        tmux.close()
    assert not tmux.alive()


# issue 49's walks -------------------------------------------------------------------------------------------------
@SIZES
def test_grpo_from_scratch_end_to_end_in_a_terminal(tmp_path, size):
    """A new recipe made grpo by keys alone, on an empty TUNER_HOME (the demo model is built under the wizard, its
    progress bars in tui.log, never on the screen); the saved file is what `tuner run --dry-run` runs."""
    home = tmp_path / "home"
    tmux = wizard(tmp_path, home, size)
    try:
        tmux.wait_for("New recipe", "Built-in recipe: demo")
        tmux.keys("Enter")  # New recipe
        tmux.wait_for("Architecture", "builtin:demo")
        tmux.keys("C-n")
        tmux.wait_for("GPUs per machine")
        tmux.keys("C-n")
        tmux.wait_for("Memory plan", "Objective")
        # method, LoRA rank, alpha, dropout, targets, Auto-fit's toggle: the objective; sft -> dpo -> kto (refused
        # at micro-batch 1: the arrows step over it, Enter would say why) -> grpo
        tmux.keys(*["Tab"] * 6, "Right", "Right", "Right", "Enter")
        tmux.wait_for("Generations", "Reward", timeout=60)  # grpo's fields
        tmux.keys("C-n")
        tmux.wait_for("builtin:reverse-prompts", "format: prompt", timeout=240)  # the demo model built meanwhile
        tmux.keys("C-n")
        tmux.wait_for("Learning rate")
        tmux.keys("C-n")
        tmux.wait_for("Save as", "recipe.lock.yaml")
        save_and_quit(tmux, tmp_path / "run.yaml")
    finally:
        tmux.close()
    assert not [screen for screen in tmux.seen if "Writing model shards" in screen or "it/s]" in screen]
    assert any("building the" in screen for screen in tmux.seen)  # the Data step said what it waited for
    assert (home / "models").is_dir() and (home / "tui.log").is_file()
    saved = yaml.safe_load((tmp_path / "run.yaml").read_text())
    assert saved["objective"]["kind"] == "grpo" and saved["data"]["source"] == "builtin:reverse-prompts"
    dry = subprocess.run([sys.executable, "-m", "tuner", "run", "run.yaml", "--dry-run"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO), "TUNER_HOME": str(home)})
    assert dry.returncode == 0, dry.stderr
    from tuner.recipe.io import load_recipe

    recipe = load_recipe(tmp_path / "run.yaml")
    lock = load_recipe(tmp_path / recipe.output.dir / "recipe.lock.yaml")
    assert lock == recipe  # what the dry run would launch is the saved recipe


@SIZES
def test_moe_lora_on_two_4090s_in_a_terminal(tmp_path, tuner_home, size):
    """Qwen3-30B-A3B on 2x RTX 4090, typed as a user would (bursts, no pauses): LoRA is refused with PEFT's reason and
    the way to lift it (dropout 0, or linear targets); both controls are on the Method step, so the user sets dropout
    0 and targets the experts there, picks LoRA, and saves a recipe `tuner run` replays."""
    tmux = wizard(tmp_path, tuner_home, size)
    try:
        tmux.wait_for("New recipe", "Built-in recipe: demo")
        tmux.keys("Enter", *"30b-a3b", "Enter")  # the search has the focus; its one match is taken
        tmux.wait_for("Qwen/Qwen3-30B-A3B", "experts")
        tmux.keys("C-n", "Tab", "2", "Tab", "Enter", *"RTX4090", "Enter")  # GPUs per machine, GPU type
        tmux.wait_for("RTX4090")
        tmux.keys("C-n")
        tmux.wait_for("Memory plan", "Objective")
        screen = " ".join(tmux.wait_for("ParamWrapper").split())
        assert "LoRA" in screen and "dropout" in screen
        # first the distribution (method, LoRA rank, alpha, dropout, targets, Auto-fit's toggle, objective): Single
        # -> DDP, as two processes need one
        tmux.keys(*["Tab"] * 7, "Right", "Enter")
        tmux.wait_for("each GPU", timeout=60)  # a plan again: the recipe has no errors
        # back to the dropout box (objective, toggle, targets, dropout): emptied and 0; its next field, the targets:
        # all linear -> attention -> attention + experts; back to the method: Full -> LoRA
        tmux.keys("BTab", "BTab", "BTab", "BTab", "C-a", "C-k", "0", "Tab", "Right", "Right", "Enter",
                  "BTab", "BTab", "BTab", "BTab", "Right", "Enter")
        tmux.wait_for("lora adapter", timeout=60)  # the refusal lifted on the screen that showed it: LoRA planned
        assert "ParamWrapper" not in tmux.screen()
        for _ in range(3):  # Data, Training, Review
            tmux.keys("C-n")
        tmux.wait_for("Save as", timeout=60)
        save_and_quit(tmux, tmp_path / "run.yaml")
    finally:
        tmux.close()
    saved = yaml.safe_load((tmp_path / "run.yaml").read_text())
    assert saved["model"]["id"] == "Qwen/Qwen3-30B-A3B" and saved["method"]["kind"] == "lora"
    assert saved["method"]["lora"]["dropout"] == 0
    assert saved["hardware"]["gpus_per_machine"] == 2 and saved["memory"]["distributed"] == "ddp"
    from tuner.recipe.io import load_recipe

    recipe = load_recipe(tmp_path / "run.yaml")
    assert recipe.method.lora.target_parameters and all(".experts." in name for name in
                                                         recipe.method.lora.target_parameters)  # the fused experts
    dry = subprocess.run([sys.executable, "-m", "tuner", "render", "run.yaml", "-o", "out"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO), "TUNER_HOME": str(tuner_home),
                              "HF_HUB_OFFLINE": "1"})
    assert dry.returncode == 0, dry.stderr  # the saved recipe is one tuner renders as is
