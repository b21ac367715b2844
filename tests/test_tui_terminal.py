"""The wizard in a real terminal: start ``python -m tuner`` under tmux, move through it, quit."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """One detached tmux session on a private server socket (never the user's own server)."""

    def __init__(self, command: str, cwd, size=(120, 36)):
        self.socket = f"tuner-test-{uuid.uuid4().hex[:8]}"
        self.session = "tuner"
        self._tmux("new-session", "-d", "-s", self.session, "-x", str(size[0]), "-y", str(size[1]),
                   "-c", str(cwd), command)

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=check)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.session, check=False).stdout

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


def test_start_navigate_and_quit_in_tmux(tmp_path, tuner_home):
    env = {"PYTHONPATH": str(REPO), "TUNER_HOME": str(tuner_home), "TERM": "xterm-256color"}
    exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
    # the shell stays after tuner exits so the test can read its exit status from the pane
    # COLUMNS/LINES from the test runner's terminal would override the pane's real size
    command = f"env -u COLUMNS -u LINES {exports} {shlex.quote(sys.executable)} -m tuner; echo tuner-exited-$?; sleep 30"
    tmux = Tmux(command, tmp_path)
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
        tmux.wait_for("tuner-exited-0", timeout=15)
    finally:
        tmux.close()
    assert not tmux.alive()
