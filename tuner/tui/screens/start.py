"""Start: a new recipe, an existing file, a built-in recipe, a recent run, or chat."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from tuner.recipe.registry import builtin_names, builtin_path, describe
from tuner.rundir.layout import LOCK_FILE
from tuner.tui.run_watch import RunWatch, recent_runs, replay
from tuner.tui.widgets.lists import PickList

if TYPE_CHECKING:
    from tuner.tui.draft import Draft

RUNS_ROOT = Path("runs")
FOLLOW_S = 2.0  # how often a running run's line is re-read
ABOUT = {
    "new": "Start from the defaults: the demo model on this machine.",
    "open": "Edit a recipe YAML file; saving asks before replacing it.",
    "chat": "Talk to a model, a recipe's model or a finished run, in the format it was trained on.",
}


def run_line(watch: RunWatch) -> str:
    """A recent run: its name, state (tuner.tui.run_watch.replay), step and last loss."""
    progress = f"step {watch.step}/{watch.max_steps}" if watch.max_steps else ""
    loss = f"loss {watch.losses[-1]:.3f}" if watch.losses else ""
    return "  ".join(part for part in (watch.run_dir.name, watch.status, progress, loss) if part)


class StartScreen(Screen):
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("Plan a fine-tuning run: model, hardware, method; see the memory plan fit; launch and watch it. "
                     "Everything ends up in one recipe file that `tuner run` replays.", id="intro")
        with Horizontal(id="start-columns"):
            with Vertical(id="start-actions"):
                yield Label("Begin", classes="section-title")
                options = [Option("New recipe", id="new"), Option("Open a recipe file…", id="open"),
                           Option("Chat with a model or a run", id="chat")]
                options += [Option(f"Built-in recipe: {name}", id=f"builtin:{name}") for name in builtin_names()]
                yield PickList(*options, id="actions")
                yield Static("", id="about")
                yield Input(placeholder="path/to/recipe.yaml, then enter", id="open-path", compact=True)
                yield Static("", id="start-error")
            with Vertical(id="start-runs"):
                yield Label("Recent runs", classes="section-title")
                yield PickList(id="runs")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#open-path", Input).display = False
        self.query_one("#start-error", Static).display = False
        self.query_one("#actions", OptionList).focus()
        self.set_interval(FOLLOW_S, self._follow_runs)

    def on_screen_resume(self) -> None:
        runs = self.query_one("#runs", OptionList)
        runs.clear_options()
        found = recent_runs(RUNS_ROOT)
        for watch in found:
            runs.add_option(Option(run_line(watch), id=str(watch.run_dir)))
        if not found:
            runs.add_option(Option(f"none yet under {RUNS_ROOT}/", disabled=True))
        self._live = [watch.run_dir for watch in found if watch.status.startswith("running")]

    def _follow_runs(self) -> None:
        """A running run's line follows its steps (re-read from its events) while this screen shows it."""
        if not self.is_current or not getattr(self, "_live", None):
            return
        runs = self.query_one("#runs", OptionList)
        for watch in map(replay, self._live):
            runs.replace_option_prompt(str(watch.run_dir), run_line(watch))
        self._live = [run_dir for run_dir in self._live if replay(run_dir).status.startswith("running")]

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_list.id == "actions":
            choice = event.option.id or ""
            self.query_one("#about", Static).update(ABOUT.get(choice) or describe(choice.removeprefix("builtin:")))

    def _open(self, draft: Draft, mode: str = "model") -> None:
        self.query_one("#open-path", Input).display = False
        self.app.load_draft(draft)
        self.app.switch_mode(mode)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        from tuner.recipe.source import RecipeError
        from tuner.tui.draft import Draft  # the schema: loaded after this screen is painted

        choice = event.option.id or ""
        self._error("")
        try:
            if event.option_list.id == "runs":
                run_dir = Path(choice)
                self.app.load_draft(Draft.from_file(run_dir / LOCK_FILE))
                own = self.app.run_watch
                if own is None or not own.running or own.run_dir.absolute() != run_dir.absolute():
                    self.app.run_watch = replay(run_dir)  # else the run this wizard follows, live
                self.app.switch_mode("run")
            elif choice == "new":
                self._open(Draft())
            elif choice == "open":
                box = self.query_one("#open-path", Input)
                box.display = True
                box.focus()
            elif choice.startswith("builtin:"):
                draft = Draft.from_file(builtin_path(choice.removeprefix("builtin:")))
                draft.path = None  # a copy: saving must not write into the built-in recipes
                self._open(draft)
            elif choice == "chat":
                self.app.switch_mode("chat")
        except RecipeError as exc:
            self._error(str(exc))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        from tuner.recipe.source import RecipeError
        from tuner.tui.draft import Draft

        try:
            self._open(Draft.from_file(event.value.strip()))
        except RecipeError as exc:
            self._error(str(exc))

    def _error(self, text: str) -> None:
        error = self.query_one("#start-error", Static)
        error.update(Text(text))  # Text: a file's contents quoted in the message are never markup
        error.display = bool(text)
