"""Chat: load a model, a recipe's model or a finished run, see where its layers went, and talk to it.

Loading and generation run in thread workers (torch and transformers are imported there);
tokens arrive as messages and are appended to the conversation as they are generated.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Label, Log, Static

from tuner.tui.screens.base import WizardScreen


def chat_available() -> bool:
    try:
        import tuner.infer.chat  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class ChatLoaded(Message):
    """A model is placed and ready (``session``), or could not be loaded (``error``)."""

    session: Any = None
    placement: str = ""
    error: str | None = None


@dataclass
class TokensArrived(Message):
    text: str


@dataclass
class AnswerFinished(Message):
    error: str | None = None


def load_session(argument: str):
    """A ChatSession for a run directory, a recipe file or name, or a model id/path; and its placement lines."""
    from tuner.infer.chat import ChatSession
    from tuner.infer.generate import Sampling
    from tuner.infer.load import default_context, load_for_inference
    from tuner.infer.placement import format_bytes
    from tuner.infer.target import is_run_directory, resolve_target
    from tuner.recipe.registry import builtin_names

    path = Path(argument).expanduser()
    is_recipe = is_run_directory(path) or path.suffix in (".yaml", ".yml") or argument in builtin_names()
    target = resolve_target(argument) if is_recipe else resolve_target(model=argument)
    sampling = Sampling.from_recipe(target.recipe)
    loaded = load_for_inference(target, context=default_context(target, sampling.max_new_tokens))
    placement = loaded.placement
    adapter = f" + adapter {target.adapter}" if target.adapter else ""
    lines = [f"model: {argument}{adapter}"]
    lines += [f"  {row.label}: {row.layers} layers, {format_bytes(row.weights_bytes)} weights"
              f" + {format_bytes(row.kv_cache_bytes)} KV cache" for row in placement.devices]
    lines += [f"  warning: {warning}" for warning in placement.warnings()]
    session = ChatSession(loaded.model, loaded.tokenizer, sampling, target.recipe.data.format)
    return session, "\n".join(lines)


class ChatScreen(WizardScreen):
    STEP = "chat"

    def compose_body(self) -> ComposeResult:
        self.session = None
        with Vertical(classes="body"):
            yield Label("Model, recipe or run directory", classes="section-title")
            yield Input(placeholder="runs/demo, demo or builtin:demo, then enter", id="chat-model", compact=True)
            yield Static("", id="placement")
            yield Log(id="conversation")
            yield Input(placeholder="message, then enter", id="chat-message", compact=True, disabled=True)

    def on_mount(self) -> None:
        super().on_mount()
        if not chat_available():
            self.query_one("#placement", Static).update(
                "chat unavailable: tuner.infer.chat is not in this build.")
            self.query_one("#chat-model", Input).disabled = True

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        if not value:
            return
        if event.input.id == "chat-model":
            self.query_one("#placement", Static).update(f"loading {value}…")
            self.query_one("#chat-message", Input).disabled = True
            self.load(value)
        elif event.input.id == "chat-message" and self.session is not None:
            event.input.value = ""
            event.input.disabled = True
            log = self.query_one("#conversation", Log)
            log.write_line(f"you> {value}")
            log.write("model> ")
            self.answer(self.session, value)

    @work(thread=True, exclusive=True, group="chat-load")
    def load(self, argument: str) -> None:
        try:
            session, placement = load_session(argument)
        except Exception as exc:  # a model that cannot load is reported on the screen, never a crashed UI
            self.post_message(ChatLoaded(error=str(exc) or type(exc).__name__))
            return
        self.post_message(ChatLoaded(session, placement))

    def on_chat_loaded(self, message: ChatLoaded) -> None:
        placement = self.query_one("#placement", Static)
        if message.error:
            placement.update(f"cannot load: {message.error}")
            return
        self.session = message.session
        placement.update(message.placement)
        self.query_one("#conversation", Log).clear()
        box = self.query_one("#chat-message", Input)
        box.disabled = False
        box.focus()

    @work(thread=True, exclusive=True, group="chat-answer")
    def answer(self, session, text: str) -> None:
        try:
            for chunk in session.send(text):
                self.post_message(TokensArrived(chunk))
        except Exception as exc:  # generation failures end the turn with the message, never the app
            self.post_message(AnswerFinished(f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(AnswerFinished())

    def on_tokens_arrived(self, message: TokensArrived) -> None:
        self.query_one("#conversation", Log).write(message.text)

    def on_answer_finished(self, message: AnswerFinished) -> None:
        log = self.query_one("#conversation", Log)
        log.write_line("" if message.error is None else f"\n(error: {message.error})")
        box = self.query_one("#chat-message", Input)
        box.disabled = False
        box.focus()
