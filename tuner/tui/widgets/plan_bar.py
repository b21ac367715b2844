"""The live memory plan: one stacked bar per device (weights, gradients, ...) against its capacity."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

TERM_STYLES = {
    "weights": "bold #5f87ff",
    "lora_adapter": "bold #87d7ff",
    "gradients": "bold #d75fd7",
    "optimizer": "bold #d7af00",
    "activations": "bold #5faf5f",
    "logits": "bold #00afaf",
    "logits_loss": "bold #00afaf",
    "overhead": "bold #8a8a8a",
}
OTHER_STYLE = "bold #af875f"
VERDICT_STYLES = {"fits": "bold green", "tight": "bold yellow", "does not fit": "bold red"}
MAX_BARS = 8  # beyond this, identical devices are summarised


def stacked_bar(terms: dict[str, float], capacity: float | None, width: int) -> Text:
    """Cells per term in proportion to the capacity; a red tail when the total passes it.

    Without a known capacity the bar is scaled to the total.
    """
    text = Text()
    total = sum(terms.values())
    if capacity is None:
        capacity = total
    scale = max(capacity, total, 1e-9)
    used = 0
    cumulative = 0.0
    for name, value in terms.items():
        cumulative += value
        end = round(cumulative / scale * width)
        cells = max(end - used, 1 if value > 0 and end >= used else 0)
        cells = min(cells, width - used)
        text.append("█" * cells, TERM_STYLES.get(name, OTHER_STYLE))
        used += cells
    capacity_cell = round(capacity / scale * width)
    if used < capacity_cell:
        text.append("░" * (capacity_cell - used), "#444444")
        used = capacity_cell
    if total > capacity and width > 0:
        text.stylize("on #5f0000", capacity_cell, width)
    text.append(" " * max(width - used, 0))
    return text


def gib(value: float) -> str:
    """Readable at every scale: the demo model's kilobytes and a 70B model's gigabytes."""
    if abs(value) >= 0.1:
        return f"{value:.2f} GiB"
    return f"{value * 1024:.1f} MiB"


def plan_text(plan: Any, width: int) -> Text:
    """The whole panel as text, from a planner MemoryPlan (duck-typed: see tuner.planner)."""
    out = Text()
    verdict = str(plan.verdict)
    out.append("verdict: ")
    out.append(verdict, VERDICT_STYLES.get(verdict, "bold"))
    missing = getattr(plan, "missing_gib", 0) or 0
    if missing > 0:
        out.append(f"  ({gib(missing)} short)", "red")
    out.append("\n")
    devices = list(plan.devices)
    shown = devices[:MAX_BARS]
    bar_width = max(width - 2, 10)
    for device in shown:
        count = getattr(device, "count", 1) or 1
        out.append(f"{device.name}{f' ×{count}' if count > 1 else ''}", "bold")
        capacity = device.capacity_gib
        limit = gib(capacity) if capacity is not None else "capacity unknown"
        out.append(f"  {gib(device.total_gib)} of {limit}", "dim")
        out.append("\n")
        out.append_text(stacked_bar(dict(device.terms), device.capacity_gib, bar_width))
        out.append("\n")
    if len(devices) > len(shown):
        out.append(f"... and {len(devices) - len(shown)} more devices with the same layout\n", "dim")
    if shown:
        out.append("\n")
        for name, value in shown[0].terms.items():
            if value <= 0:
                continue
            out.append("■ ", TERM_STYLES.get(name, OTHER_STYLE))
            out.append(f"{name.replace('_', ' ')} {gib(value)}\n")
    host = getattr(plan, "host_ram_gib", None)
    if host:
        out.append(f"\nhost RAM needed: {gib(host)}\n")
    for note in getattr(plan, "notes", None) or []:
        out.append(f"• {note}\n", "dim")
    return out


class PlanPanel(Widget):
    """Shows ``plan``; ``status`` replaces it when there is nothing to plan (invalid draft, no planner)."""

    DEFAULT_CSS = """
    PlanPanel { height: auto; padding: 0 1; }
    """

    plan: reactive[Any] = reactive(None, layout=True)
    status: reactive[str] = reactive("", layout=True)

    def render(self) -> Text:
        if self.plan is None:
            return Text(self.status or "no plan yet", style="italic")
        return plan_text(self.plan, self.size.width)
