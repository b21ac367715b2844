"""Builders shared by the TUI tests: a wizard app on a fixed draft, in a clean working directory."""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
from textual.widgets import Input
from textual.worker import WorkerCancelled

from tuner.recipe.io import parse_yaml, read_recipe_text
from tuner.recipe.registry import builtin_path
from tuner.tui.app import TunerApp
from tuner.tui.draft import Draft
from tuner.check import Check
from tuner.planner import Advice, DevicePlan, MemoryPlan
from tuner.planner.items import Item
from tuner.tui.planning import Planner

SIZE = (120, 36)
SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])  # issue 49's two terminals


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """A test's own working directory (recipes and runs are written there), and no blinking cursor (stable screens).
    Autouse in each test module that imports it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)
    return tmp_path

# The demo recipe made to finish in seconds: few samples, few steps, frequent logs.
QUICK_RUN = {
    "training.max_steps": 6,
    "training.micro_batch_size": 4,
    "training.max_seq_length": 32,
    "training.logging_steps": 1,
    "training.warmup_steps": 0,
    "data.max_samples": 200,
    "data.eval_fraction": 0.0,
}


def demo_draft(changes: dict | None = None) -> Draft:
    data, _ = parse_yaml(read_recipe_text(builtin_path("demo")))
    draft = Draft(copy.deepcopy(data))
    if changes:
        draft.apply(changes)
    return draft


def make_app(draft: Draft | None = None, **kwargs) -> TunerApp:
    return TunerApp(draft=draft, detect_hardware=False, **kwargs)


async def settle(pilot, timeout: float = 120.0) -> None:
    """Until every message is handled and every worker has finished, however long that takes under load (a single
    ``pilot.pause()`` only lets the loop turn once)."""
    app = pilot.app
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    def busy() -> bool:
        nodes = [app, app.screen, *app.screen.walk_children()]
        keys = getattr(app, "_key_router", None)  # keys read and not yet routed (KeysInOrderApp.on_event)
        return (any(node._message_queue.qsize() for node in nodes) or any(not w.is_finished for w in app.workers)
                or (keys is not None and not keys.done()))

    while True:
        await pilot.pause()
        try:
            await app.workers.wait_for_complete()
        except WorkerCancelled:  # an exclusive worker replaced by a newer one: finished too
            pass
        await pilot.pause()
        if not busy():
            return
        if loop.time() > deadline:
            raise AssertionError(f"the wizard was still busy after {timeout} s")


async def wait_until(pilot, condition, timeout: float = 60.0, step: float = 0.2) -> None:
    """Let the app run until ``condition()`` holds (workers and messages need the loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {condition}")
        await pilot.pause(step)


GIB = 2**30
MIB = 1 / 1024


def device(name: str, capacity_gib: float | None, terms: dict[str, float], kind: str = "gpu",
           count: int = 1) -> DevicePlan:
    """A planner DevicePlan holding one item per term (GiB), all live at the peak."""
    return DevicePlan(name, capacity_gib, [Item(term, term, gib * GIB) for term, gib in terms.items()], count, kind)


def memory_plan(devices: list[DevicePlan], verdict: str, missing_gib: float = 0.0, host_ram_gib: float = 0.0,
                notes: list[str] | None = None) -> MemoryPlan:
    return MemoryPlan("frozen", devices, verdict, missing_gib, host_ram_gib, notes or [], {"total": 1}, 1, 1, 1)


def fixed_plan(recipe) -> MemoryPlan:
    """Plans with the numbers tuner's planner gave for these recipes, frozen, so snapshots test the UI
    and not the planner's latest arithmetic."""
    if not recipe.uses_gpu:
        return memory_plan([device("CPU RAM", recipe.hardware.host_ram_gb or 16.0, {
            "weights": 2.8 * MIB, "optimizer": 5.6 * MIB, "activations": 86.1 * MIB, "logits_loss": 2.3 * MIB,
            "overhead": 1.0}, kind="cpu")], "fits")
    if recipe.memory.distributed == "deepspeed":
        return memory_plan([device("GPU (RTX4090)", 24.0, {"weights": 14.96, "gradients": 0.06, "activations": 0.96,
                                                           "logits_loss": 2.94, "overhead": 1.55}),
                            device("host RAM (per machine, 1 GPU(s))", 256.0,
                                   {"optimizer": 89.74, "gradients": 29.92}, kind="host")],
                           "fits", host_ram_gib=119.66)
    return memory_plan([device("GPU (RTX4090)", 24.0, {"weights": 14.96, "gradients": 14.96, "optimizer": 44.87,
                                                       "overhead": 4.34})], "does not fit", missing_gib=55.13)


def fixed_advice(recipe, host_ram_gib=None) -> list[Advice]:
    ladder = [
        (["zero2", "gradient_checkpointing", "offload_optimizer"], 0.90,
         {"memory.distributed": "deepspeed", "memory.zero_stage": 2, "memory.gradient_checkpointing": True,
          "memory.offload_optimizer": "cpu"}),
        (["gradient_checkpointing", "zero3", "offload_optimizer"], 1.15,
         {"memory.distributed": "deepspeed", "memory.zero_stage": 3, "memory.gradient_checkpointing": True,
          "memory.offload_optimizer": "cpu"}),
    ]
    proposals = []
    for changes, cost, values in ladder:
        draft = Draft(recipe.model_dump(mode="json"))
        draft.apply(values)
        plan = fixed_plan(draft.recipe)
        if changes[0] == "gradient_checkpointing":  # the second plan is slower and smaller
            plan = memory_plan([device("GPU (RTX4090)", 24.0, {"weights": 1.9, "activations": 0.96, "logits_loss": 2.94,
                                                               "overhead": 1.55}), plan.devices[1]], "fits",
                               host_ram_gib=119.66)
        proposals.append(Advice(draft.recipe, plan, cost, [f"apply {name}" for name in changes], changes))
    return proposals


def fixed_disk(recipe, plan) -> Check:
    return Check("disk", "ok", f"output {recipe.output.dir}: plenty of room")


FIXED_PLANNER = Planner(plan=fixed_plan, advise=fixed_advice, disk=fixed_disk)


def choice_held(draft: Draft, choice) -> bool:
    """Whether the recipe already has what ``choice`` stands for, by an oracle that knows nothing of the widgets:
    its values applied to a copy of the recipe change nothing it resolves to (an objective: its kind; a choice of
    what the recipe writes, such as ``auto`` weights: what it writes too)."""
    from tuner.tui.screens.method_choices import WrittenChoice
    from tuner.tui.widgets.fields import ObjectiveChoice

    if isinstance(choice, ObjectiveChoice):
        return draft.value("objective.kind") == choice.changes["objective.kind"]
    changes = choice.changes_for(draft)
    other = Draft(copy.deepcopy(draft.data))
    other.apply(changes)
    if isinstance(choice, WrittenChoice) and any(other.written(field) != draft.written(field) for field in changes):
        return False
    return other.resolved.model_dump(mode="json") == draft.resolved.model_dump(mode="json")


def pilot_test(scenario):
    """Run an async pilot scenario as a plain test (no async pytest plugin needed)."""
    import functools

    @functools.wraps(scenario)
    def test(*args, **kwargs):
        asyncio.run(scenario(*args, **kwargs))

    return test


def read_files(directory: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(directory.iterdir()) if path.is_file()}


SNAPSHOTS = Path(__file__).parent / "__snapshots__" / "test_tui_snapshots"
DOCS_IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
DOCS_SCREENSHOTS = {  # snapshot file -> docs/images name
    "test_screen[start].svg": "tui-start.svg",
    "test_screen[model].svg": "tui-model.svg",
    "test_screen[hardware].svg": "tui-hardware.svg",
    "test_screen[method].svg": "tui-method.svg",
    "test_method_with_disabled_reasons_on_focus.svg": "tui-method-reasons.svg",
    "test_method_after_autofit_on_a_gpu.svg": "tui-method-autofit.svg",
    "test_screen[data].svg": "tui-data.svg",
    "test_screen[training].svg": "tui-training.svg",
    "test_screen[review].svg": "tui-review.svg",
    "test_run_screen.svg": "tui-run.svg",
    "test_chat_with_the_demo_model_loaded.svg": "tui-chat.svg",
    "test_help.svg": "tui-help.svg",
    "test_screen_at_80x24[method].svg": "tui-method-80x24.svg",
    "test_screen_at_80x24[run].svg": "tui-run-80x24.svg",
}


def export_docs_images() -> None:
    """Copy the accepted snapshots to docs/images (run after --snapshot-update)."""
    import shutil

    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    for snapshot, image in DOCS_SCREENSHOTS.items():
        shutil.copyfile(SNAPSHOTS / snapshot, DOCS_IMAGES / image)


if __name__ == "__main__":
    export_docs_images()
