"""Chat: load a model, a recipe's model or a finished run, see where its layers went, and talk to it.

A run or recipe is asked in the format it was trained on (the demo: ``reverse`` + your word).
Loading and generation run in thread workers (torch and transformers are imported there);
tokens arrive as messages and grow the model's line of the conversation as they are generated.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Label, Static

from tuner.catalog.demo import DEMO_MODEL_ID
from tuner.tui.screens.base import WizardScreen

SPEAKER_STYLES = {"you": "bold cyan", "model": "bold green"}


@dataclass
class ChatLoaded(Message):
    """A model is placed and ready (``session``), or could not be loaded (``error``)."""

    argument: str
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
    """A ChatSession for a run directory, a recipe file or name, or a model id/path; and the lines that say
    where it was placed and how messages are sent."""
    from tuner.infer.chat import ChatSession
    from tuner.infer.generate import Sampling
    from tuner.infer.load import default_context, load_for_inference
    from tuner.infer.placement import format_bytes
    from tuner.infer.prompt_format import PromptFormat, trained_prompt_format
    from tuner.infer.target import is_run_directory, resolve_target
    from tuner.recipe.registry import builtin_names

    path = Path(argument).expanduser()
    is_recipe = is_run_directory(path) or path.suffix in (".yaml", ".yml") or argument in builtin_names()
    target = resolve_target(argument, show_download=False) if is_recipe else resolve_target(model=argument,
                                                                                             show_download=False)
    sampling = Sampling.from_recipe(target.recipe)
    loaded = load_for_inference(target, context=default_context(target, sampling.max_new_tokens))
    prompt = trained_prompt_format(target.recipe) if is_recipe else PromptFormat(target.recipe.data.format)
    placement = loaded.placement
    adapter = f" + adapter {target.adapter}" if target.adapter else ""
    lines = [f"model: {argument}{adapter}"]
    lines += [f"  {row.label}: {row.layers} layers, {format_bytes(row.weights_bytes)} weights"
              f" + {format_bytes(row.kv_cache_bytes)} KV cache" for row in placement.devices]
    lines += [f"  warning: {warning}" for warning in placement.warnings()]
    how = "greedy (the most likely token)" if sampling.greedy else f"sampling at temperature {sampling.temperature:g}"
    lines.append(f"  answers: {how}, up to {sampling.max_new_tokens} tokens")
    if prompt.note:
        lines.append(f"  prompt: {prompt.note}")
    session = ChatSession(loaded.model, loaded.tokenizer, sampling, prompt.data_format, instruction=prompt.instruction)
    return session, "\n".join(lines)


class ChatScreen(WizardScreen):
    STEP = "chat"

    def compose_body(self) -> ComposeResult:
        self.session = None
        self.target: str | None = None  # what is being loaded (or was, last)
        self.turns: list[list[str]] = []  # [speaker, text]: one line each, the model's grows as tokens arrive
        with Vertical(classes="body"):
            yield Label("Model, recipe or run directory", classes="section-title")
            yield Input(placeholder=f"runs/demo, demo or {DEMO_MODEL_ID}, then enter", id="chat-model", compact=True)
            yield Static("", id="placement")
            with VerticalScroll(id="conversation-box"):
                yield Static("", id="conversation")
            yield Input(placeholder="message, then enter", id="chat-message", compact=True, disabled=True)

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        target = self.app.chat_target
        if target and target != self.target:  # "Chat with this run" sent us here: prefilled and loading
            self.query_one("#chat-model", Input).value = target
            self._load(target)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        if not value:
            return
        if event.input.id == "chat-model":
            self._load(value)
        elif event.input.id == "chat-message" and self.session is not None:
            event.input.value = ""
            event.input.disabled = True
            self.turns += [["you", value], ["model", ""]]
            self._show_turns()
            self.answer(self.session, value)

    def _load(self, argument: str) -> None:
        self.target = argument
        self.session = None
        self.query_one("#placement", Static).update(Text(f"loading {argument}…"))
        self.query_one("#chat-message", Input).disabled = True
        self.load(argument)

    @work(thread=True, exclusive=True, group="chat-load")
    def load(self, argument: str) -> None:
        try:
            session, placement = load_session(argument)
        except Exception as exc:  # a model that cannot load is reported on the screen, never a crashed UI
            self.post_message(ChatLoaded(argument, error=str(exc) or type(exc).__name__))
            return
        self.post_message(ChatLoaded(argument, session, placement))

    def on_chat_loaded(self, message: ChatLoaded) -> None:
        if message.argument != self.target:
            return  # an answer for something no longer wanted
        placement = self.query_one("#placement", Static)
        if message.error:
            placement.update(Text(f"cannot load: {message.error}"))
            return
        self.session = message.session
        placement.update(Text(message.placement))
        self.turns = []
        self._show_turns()
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

    def _show_turns(self) -> None:
        text = Text()
        for index, (speaker, said) in enumerate(self.turns):
            if index:
                text.append("\n")
            text.append(f"{speaker}> ", SPEAKER_STYLES.get(speaker, "bold"))
            text.append(said)
        self.query_one("#conversation", Static).update(text)
        self.query_one("#conversation-box", VerticalScroll).scroll_end(animate=False)

    def on_tokens_arrived(self, message: TokensArrived) -> None:
        self.turns[-1][1] += message.text
        self._show_turns()

    def on_answer_finished(self, message: AnswerFinished) -> None:
        if message.error is not None:
            self.turns.append(["error", message.error])
        self._show_turns()
        box = self.query_one("#chat-message", Input)
        box.disabled = False
        box.focus()
