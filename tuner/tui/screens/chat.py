"""Chat: load a model or a finished run and talk to it, tokens streamed as they are generated."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, Log, Static

from tuner.tui.screens.base import WizardScreen


def chat_available() -> bool:
    try:
        import tuner.infer.chat  # noqa: F401
    except ImportError:
        return False
    return True


class ChatScreen(WizardScreen):
    STEP = "chat"

    def compose_body(self) -> ComposeResult:
        with Vertical(classes="body"):
            yield Label("Model or run directory", classes="section-title")
            yield Input(placeholder="runs/demo or builtin:demo, then enter", id="chat-model", compact=True)
            yield Static("", id="placement")
            yield Log(id="conversation")
            yield Input(placeholder="message, then enter", id="chat-message", compact=True, disabled=True)

    def on_mount(self) -> None:
        super().on_mount()
        if not chat_available():
            self.query_one("#placement", Static).update(
                "chat unavailable: tuner.infer.chat is not in this build yet; use `tuner infer` when it lands.")
            self.query_one("#chat-model", Input).disabled = True
