"""Review: the exact files a run gets and the exact command, then save the recipe (asking before overwriting)."""
from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Input, Label, Static, TabbedContent, TabPane

from tuner.recipe.io import RecipeError
from tuner.tui.screens.base import WizardScreen
from tuner.tui.screens.confirm import ConfirmScreen

LEXERS = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".sh": "bash", ".toml": "toml"}


def highlighted(name: str, text: str):
    from rich.syntax import Syntax  # pygments: loaded on the first Review, not at startup

    return Syntax(text, LEXERS.get(Path(name).suffix, "text"), theme="monokai", line_numbers=True,
                  word_wrap=False, background_color="default")


def rendered_files(recipe) -> tuple[dict[str, str], str]:
    """What ``tuner render`` writes for this recipe and the command ``tuner run`` launches."""
    from tuner.launch.argv import launch_argv, shell_command
    from tuner.render.run_directory import render_run_files

    return render_run_files(recipe), shell_command(launch_argv(Path(recipe.output.dir)))


class ReviewScreen(WizardScreen):
    STEP = "review"
    BINDINGS = [Binding("ctrl+s", "save", "Save recipe", id="save", tooltip="Write the recipe YAML")]

    def compose_body(self) -> ComposeResult:
        self.files: dict[str, str] = {}
        with TabbedContent(id="files"):
            yield TabPane("no files", Static("the recipe has errors"))
        yield Static("", id="command")
        with Horizontal(id="save-row"):
            yield Label("Save as", classes="field-label")
            yield Input(id="save-path", compact=True)
            yield Button("Save (ctrl+s)", id="save", variant="primary")

    def sync(self) -> None:
        super().sync()
        draft = self.app.draft
        box = self.query_one("#save-path", Input)
        if not box.value:
            box.value = str(draft.path or f"{draft.last_valid.name}.yaml")
        if draft.recipe is None:
            self.files = {}
            self.query_one("#command", Static).update("fix the errors below to see the files")
            self.call_later(self._show_files)
            return
        files, command = rendered_files(draft.recipe)
        self.query_one("#command", Static).update(f"$ {command}")
        if files != self.files:
            self.files = files
            self.call_later(self._show_files)

    async def _show_files(self) -> None:
        tabs = self.query_one("#files", TabbedContent)
        await tabs.clear_panes()
        for index, (name, text) in enumerate(self.files.items()):
            await tabs.add_pane(TabPane(name, VerticalScroll(Static(highlighted(name, text))), id=f"file-{index}"))
        if not self.files:
            await tabs.add_pane(TabPane("no files", Static("the recipe has errors")))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()

    def action_save(self) -> None:
        path = Path(self.query_one("#save-path", Input).value.strip() or "recipe.yaml")
        if path.exists():
            self.app.push_screen(ConfirmScreen(f"{path} exists. Overwrite it with this recipe?"),
                                 lambda yes: self._save(path) if yes else None)
        else:
            self._save(path)

    def _save(self, path: Path) -> None:
        try:
            self.app.draft.save(path, overwrite=True)
        except (RecipeError, OSError) as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.notify(f"saved {path}; replay it with: tuner run {path}")
