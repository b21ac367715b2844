"""Review: the exact files a run gets and the exact command, then save the recipe (asking before overwriting)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Input, Label, Static, TabbedContent, TabPane

from tuner.recipe.source import RecipeError
from tuner.recipe.warnings import recipe_warnings
from tuner.tui.messages import DiskChecked, PlanUpdated
from tuner.tui.recipe_file import save_problem
from tuner.tui.screens.base import WizardScreen
from tuner.tui.screens.confirm import ConfirmScreen
from tuner.tui.widgets.plan_bar import Verdict

LEXERS = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".sh": "bash", ".toml": "toml"}


def highlighted(name: str, text: str):
    from rich.syntax import Syntax  # pygments: loaded on the first Review, not at startup

    return Syntax(text, LEXERS.get(Path(name).suffix, "text"), theme="monokai", line_numbers=True,
                  word_wrap=False, background_color="default")


def rendered_files(recipe) -> tuple[dict[str, str], str]:
    """What ``tuner render`` writes for this recipe and the command ``tuner run`` launches."""
    from tuner.render.launch_command import launch_argv, shell_command
    from tuner.render.run_directory import render_run_files

    return render_run_files(recipe), shell_command(launch_argv(Path(recipe.output.dir)))


@dataclass
class FilesRendered(Message):
    """The run files of ``recipe`` (FSDP rendering reads the model's config, so it runs in a worker)."""

    recipe: object
    files: dict[str, str] = field(default_factory=dict)
    command: str = ""
    error: str | None = None


class ReviewScreen(WizardScreen):
    STEP = "review"
    BINDINGS = [Binding("ctrl+s", "save", "Save recipe", id="save", tooltip="Write the recipe YAML")]

    def compose_body(self) -> ComposeResult:
        self.files: dict[str, str] = {}
        self.suggested: tuple | None = None  # (draft, file name) last put in the save box
        yield Verdict(id="verdict")  # every recipe's, fitting or not
        with TabbedContent(id="files"):
            yield TabPane("no files", Static("the recipe has errors"))
        yield Static("", id="command")
        with Horizontal(id="save-row"):
            yield Label("Save as", classes="field-label")
            yield Input(id="save-path", compact=True)
            yield Button("Save ^s", id="save", variant="primary", compact=True)

    def sync(self) -> None:
        super().sync()
        self.query_one(Verdict).show(self.app)
        draft = self.app.draft
        box = self.query_one("#save-path", Input)
        suggested = str(draft.path or f"{draft.value('name')}.yaml")
        if self.suggested is None or box.value == self.suggested[1] or self.suggested[0] is not draft:
            box.value = suggested  # a new recipe, or a name change the user has not overridden here
        self.suggested = (draft, suggested)
        if draft.recipe is None:
            self._show(FilesRendered(None, error="fix the errors below to see the files"))
            return
        self.render_files(draft.recipe)

    def on_plan_updated(self, message: PlanUpdated) -> None:
        self.query_one(Verdict).show(self.app)

    def on_disk_checked(self, message: DiskChecked) -> None:
        self.query_one(Verdict).disk = message.check

    @work(thread=True, exclusive=True)
    def render_files(self, recipe) -> None:
        try:
            files, command = rendered_files(recipe)
        except RecipeError as exc:
            self.post_message(FilesRendered(recipe, error=str(exc)))
            return
        self.post_message(FilesRendered(recipe, files, command))

    def on_files_rendered(self, message: FilesRendered) -> None:
        if message.recipe is self.app.draft.recipe:  # else an answer for an older draft
            self._show(message)

    def _show(self, rendered: FilesRendered) -> None:
        warnings = recipe_warnings(rendered.recipe) if rendered.recipe is not None else []
        lines = [*(f"warning: {warning}" for warning in warnings), rendered.error or f"$ {rendered.command}"]
        self.query_one("#command", Static).update(Text("\n".join(lines)))  # Text: paths and ids are never markup
        if rendered.files != self.files or not rendered.files:
            self.files = rendered.files
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
        problem = save_problem(path)  # a folder, a missing folder, no permission: said before anything is asked
        if problem:
            self.notify(problem, severity="error", timeout=8, markup=False)
            return
        if path.exists():
            self.app.push_screen(ConfirmScreen(f"{path} exists. Overwrite it with this recipe?"),
                                 lambda yes: self._save(path) if yes else None)
        else:
            self._save(path)

    def _save(self, path: Path) -> None:
        try:
            self.app.draft.save(path, overwrite=True)
        except (RecipeError, OSError) as exc:
            self.notify(str(exc), severity="error", timeout=8, markup=False)
            return
        self.notify(f"saved {path}; replay it with: tuner run {path}", markup=False)
