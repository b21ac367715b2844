"""``?``: the keys, and what each step of the wizard is for."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# tuner: keys

| Key | Does |
|---|---|
| `ctrl+n` | next step |
| `esc` | previous step (Start from the first) |
| `tab` / `shift+tab` | next / previous field |
| `←` `→` `↑` `↓`, `enter`, `space` | choose within a field |
| `f` | Auto-fit (Method): list the plans that fit as changes to this recipe; `enter` applies one |
| `ctrl+s` | save the recipe (Review) |
| `ctrl+r` | launch the run (Run); `ctrl+x` cancels it, `ctrl+e` resumes it |
| `ctrl+t` | chat with the finished run (Run) |
| `?` / `f1` | this help |
| `ctrl+q` | quit (while a run is going it asks, then stops every rank cleanly) |

# The steps

1. **Model**: what to fine-tune: the catalog, a local directory or a hub id.
2. **Hardware**: machines, GPUs per machine (0 = CPU), GPU type, host RAM.
3. **Method**: full / LoRA / QLoRA and the memory tactics, beside the live memory plan and its
   verdict (which memory is short: GPU, host RAM, or the disk for checkpoints).
   A greyed-out choice conflicts with the rest of the recipe: hover it, or focus its field, to read why.
4. **Data**: where samples come from and one formatted example; the shaded part earns no loss.
5. **Training**: learning rate, schedule, steps, checkpoints, output directory.
6. **Review**: the exact files and command; save the recipe.
7. **Run**: launch, watch progress and loss, cancel or resume; then chat with the result.

**Chat** (from Start, or `ctrl+t` on a finished run): talk to a model, a recipe's model or a run,
asked the way it was trained (the demo: your word becomes the input of `reverse`).

A box keeps what you typed; a value its field refuses is marked, with the reason under it, and
is left out of the recipe until it is fixed. Everything the wizard does is in the saved recipe:
`tuner run saved.yaml` replays it without a terminal UI.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close", id="close_help")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Markdown(HELP)
