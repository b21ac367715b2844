"""The live memory plan: one stacked bar per device (weights, gradients, ...) against its capacity."""
from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tuner.check import Check
from tuner.planner import DevicePlan, MemoryPlan
from tuner.planner.items import GENERATION

TERM_STYLES = {
    "weights": "bold #5f87ff",
    "reference_model": "bold #8787d7",  # dpo/kto's frozen copy: a paler weights colour
    "reward_model": "bold #af87d7",  # grpo's reward models: beside the reference
    "teacher_model": "bold #d787d7",  # distill's teacher: frozen weights, beside them
    "lora_adapter": "bold #87d7ff",
    "gradients": "bold #d75fd7",
    "optimizer": "bold #d7af00",
    "activations": "bold #5faf5f",
    "logits_loss": "bold #00afaf",
    "generation": "bold #d75f5f",  # grpo's rollout: KV cache, sampler, vLLM's share
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
    if 0 < abs(value) * 1024 < 0.1:
        return "<0.1 MiB"
    return f"{value * 1024:.1f} MiB"


SHORT_RESOURCE = {"gpu": "GPU memory", "host": "host RAM", "cpu": "RAM"}  # DevicePlan.kind -> what runs short


def shortest_device(plan: MemoryPlan) -> DevicePlan | None:
    """The device whose capacity the plan overflows the most (the resource to add or to save)."""
    short = [device for device in plan.devices if device.headroom_gib is not None and device.headroom_gib < 0]
    return min(short, key=lambda device: device.headroom_gib, default=None)


def verdict_text(plan: MemoryPlan, disk: Check | None = None) -> Text:
    """``verdict: does not fit: host RAM is 306.30 GiB short``, naming what is short (memory, then disk)."""
    out = Text("verdict: ")
    verdict = str(plan.verdict)
    disk_short = disk is not None and disk.status == "fail"
    out.append(verdict, VERDICT_STYLES.get(verdict, "bold"))
    device = shortest_device(plan)
    if device is not None:
        out.append(f": {SHORT_RESOURCE.get(device.kind, device.name)} is {gib(-device.headroom_gib)} short", "red")
        if device.count > 1:
            out.append(" on each GPU", "red")
    if disk_short:
        out.append(f"{'; and' if device else ';'} disk is short: {disk.detail}", "red")
    return out


def peak_text(plan: MemoryPlan) -> Text:
    """``GPU peak 673.91 GiB of 24.00 GiB each, headroom -649.91 GiB``: the training device's peak against its
    capacity (its headroom negative where it does not fit), as ``tuner plan`` prints them."""
    device = plan.gpu
    out = Text(f"{SHORT_RESOURCE.get(device.kind, device.name).removesuffix(' memory')} peak {gib(device.total_gib)}",
               "bold")
    if device.capacity_gib is None:
        return out.append(" (capacity unknown)", "dim")
    out.append(f" of {gib(device.capacity_gib)}{' each' if device.count > 1 else ''}, ")
    out.append(f"headroom {gib(device.headroom_gib)}", "red" if device.headroom_gib < 0 else "green")
    return out


def measured_marker(measured_gib: float, device: DevicePlan, width: int, label: str) -> Text:
    """A line under a device's bar: ``▲`` at the measured peak on the bar's scale (the larger of the capacity and
    the prediction) and what it is, after the marker where it fits, else before it."""
    scale = max(device.capacity_gib or device.total_gib, device.total_gib, 1e-9)
    cell = min(round(measured_gib / scale * width), width - 1)
    words = f"{label}: {gib(measured_gib)} (plan {gib(device.total_gib)})"
    if cell + 2 + len(words) <= width or cell < len(words) + 1:
        return Text.assemble(" " * cell, ("▲ ", "bold magenta"), (words, "magenta"))
    return Text.assemble(" " * (cell - len(words) - 1), (words, "magenta"), (" ▲", "bold magenta"))


def device_heading(device: DevicePlan) -> Text:
    out = Text(device.name, "bold")
    limit = gib(device.capacity_gib) if device.capacity_gib is not None else "an unknown capacity"
    out.append(f"{', each' if device.count > 1 else ''}: {gib(device.total_gib)} of {limit}", "dim")
    return out


def legend(terms: dict[str, float], width: int) -> Text:
    """What each colour of a bar stands for, with its amount (every bar gets its own), packed into lines
    of ``width`` so that no entry is split."""
    out, used = Text(), 0
    for name, value in terms.items():
        if value <= 0:
            continue
        entry = Text("■ ", TERM_STYLES.get(name, OTHER_STYLE))
        entry.append(f"{name.replace('_', ' ')} {gib(value)}")
        if used and used + 2 + len(entry) > width:
            out.append("\n")
            used = 0
        elif used:
            out.append("  ")
            used += 2
        out.append_text(entry)
        used += len(entry)
    return out


def parts_text(plan: MemoryPlan) -> Text:
    """An image-text model's weights by part, and which train: ``vision tower 0.77 GiB frozen · projector ...``."""
    from tuner.planner.vision import NAMES

    out = Text("weights by part: ", "bold")
    for index, (part, info) in enumerate(plan.parts.items()):
        out.append(" · " if index else "")
        out.append(f"{NAMES[part]} {gib(info['weights_gib'])} ")
        out.append("trains" if info["trains"] else "frozen", "green" if info["trains"] else "dim")
    return out


def summary_text(plan: MemoryPlan, disk: Check | None = None) -> Text:
    """The verdict and the training device's peak and headroom (what Review and the pinned line above the plan show)."""
    return Text("\n").join([verdict_text(plan, disk), peak_text(plan)])


def plan_text(plan: MemoryPlan, width: int, disk: Check | None = None, measured=None, verdict: bool = True) -> Text:
    """The whole panel as text: the verdict (unless shown apart, ``verdict=False``), then per device a bar against
    its capacity and its legend; a probe's ``measured`` peak (tuner.planner.measured.MeasuredRecord) as a marker under
    the training device's bar."""
    out = summary_text(plan, disk) if verdict else Text()
    if verdict:
        out.append("\n")
    devices = list(plan.devices)
    shown = devices[:MAX_BARS]
    bar_width = max(width - 2, 10)
    for device in shown:
        out.append("\n")
        out.append_text(device_heading(device))
        out.append("\n")
        if device.capacity_gib is not None:
            out.append_text(stacked_bar(dict(device.terms), device.capacity_gib, bar_width))
            out.append("\n")
            if measured is not None and device is plan.gpu:
                out.append_text(measured_marker(measured.measured_gib, device, bar_width,
                                                f"measured {measured.date}"))
                out.append("\n")
        elif device.kind == "host":
            out.append("set Host RAM on the Hardware screen to check it\n", "italic")
        out.append_text(legend(device.terms, width))
        out.append("\n")
        if GENERATION in device.phases and device.phase != GENERATION:  # grpo: the rollout's own peak, below
            moment = device.phase_moment(GENERATION)
            out.append(f"generation ({moment}): {gib(device.moment_gib(moment))}\n", "dim")
            terms = device.terms_at(moment)
            if device.capacity_gib is not None:
                out.append_text(stacked_bar(terms, device.capacity_gib, bar_width))
                out.append("\n")
            out.append_text(legend(terms, width))
            out.append("\n")
    if len(devices) > len(shown):
        out.append(f"... and {len(devices) - len(shown)} more devices with the same layout\n", "dim")
    if plan.parts:
        out.append("\n").append_text(parts_text(plan)).append("\n")
    for note in plan.notes:
        out.append(f"\n• {note}", "dim")
    return out


class PlanView(Widget):
    """What a view of the plan reads; ``status`` says why there is no plan (invalid draft, unknown model)."""

    plan: reactive[MemoryPlan | None] = reactive(None, layout=True)
    status: reactive[str] = reactive("", layout=True)
    disk: reactive[Check | None] = reactive(None, layout=True)
    measured = reactive(None, layout=True)  # a probe's record of this setup on this machine (MeasuredRecord)

    def show(self, app) -> None:
        """Read the app's plan, its status, disk check and measurement (after any change)."""
        self.plan, self.status, self.disk, self.measured = app.plan, app.plan_status, app.disk_check, app.measured


class PlanPanel(PlanView):
    """Shows ``plan``; ``status`` replaces it when there is nothing to plan.  ``verdict=False``: the verdict is shown
    apart (a :class:`Verdict` pinned above a panel that scrolls)."""

    DEFAULT_CSS = """
    PlanPanel { height: auto; padding: 0 1; }
    """

    def __init__(self, *, verdict: bool = True, id: str | None = None):
        super().__init__(id=id)
        self.verdict = verdict

    def render(self) -> Text:
        if self.plan is None:
            return Text(self.status or "no plan yet", style="italic") if self.verdict else Text()
        return plan_text(self.plan, self.size.width, self.disk, self.measured, verdict=self.verdict)


class Verdict(PlanView):
    """The verdict with the peak and headroom, or why there is no plan: for every recipe, fitting or not."""

    DEFAULT_CSS = """
    Verdict { height: auto; padding: 0 1; }
    """

    def render(self) -> Text:
        if self.plan is None:
            return Text(self.status or "no plan yet", style="italic")
        return summary_text(self.plan, self.disk)
