"""Messages the wizard posts, named as things that happened ("attributes down, messages up")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual.message import Message

if TYPE_CHECKING:  # the draft (the schema) and the planner load after the first screen is painted
    from tuner.check import Check
    from tuner.planner import MemoryPlan
    from tuner.rundir.events import Event
    from tuner.tui.draft import Changes


@dataclass
class FieldEdited(Message):
    """A form field changed; the app applies ``changes`` to the draft (``typed``: the text typed in a box).
    ``chosen``: a choice that its own rule found the draft does not hold yet (``auto`` weights are held by what the
    recipe writes, not by the dtype it resolves to), applied even where the resolved values already agree."""

    changes: Changes
    typed: str | None = None
    chosen: bool = False


@dataclass
class TextTyped(Message):
    """A box put its text into the draft (it does so the moment the text changes); the app replans and re-syncs."""

    field: str


@dataclass
class PlanUpdated(Message):
    """A memory plan was computed for the current draft (None: the recipe is invalid or cannot be planned)."""

    plan: MemoryPlan | None
    elapsed_ms: float


@dataclass
class DiskChecked(Message):
    """The output directory's free space was checked against what the run's checkpoints need."""

    check: Check | None


@dataclass
class RunEventsArrived(Message):
    """New events and log lines from the launched run."""

    events: list[Event]
    log_lines: list[str]


@dataclass
class RunNotStarted(Message):
    """The run contract refused the launch (``can_override``: the Run screen offers "Launch anyway"), or the run
    spans several machines and ``lines`` say what to start on each."""

    watch: Any
    lines: list[str]
    can_override: bool = False


@dataclass
class RunFinished(Message):
    """The launched process group exited; ``lines`` say how it ended (the summary, the failure, or how to continue)."""

    exit_code: int
    lines: list[str]
