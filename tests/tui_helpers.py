"""Builders shared by the TUI tests: a wizard app on a fixed draft, in a clean working directory."""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path

from tuner.recipe.io import parse_yaml, read_recipe_text
from tuner.recipe.registry import builtin_path
from tuner.tui.app import TunerApp
from tuner.tui.draft import Draft

SIZE = (120, 36)

# The demo recipe made to finish in seconds: few samples, few steps, frequent logs.
QUICK_RUN = {
    "training.max_steps": 6,
    "memory.micro_batch_size": 4,
    "memory.max_seq_length": 32,
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


async def wait_until(pilot, condition, timeout: float = 60.0, step: float = 0.2) -> None:
    """Let the app run until ``condition()`` holds (workers and messages need the loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {condition}")
        await pilot.pause(step)


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
}


def export_docs_images() -> None:
    """Copy the accepted snapshots to docs/images (run after --snapshot-update)."""
    import shutil

    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    for snapshot, image in DOCS_SCREENSHOTS.items():
        shutil.copyfile(SNAPSHOTS / snapshot, DOCS_IMAGES / image)


if __name__ == "__main__":
    export_docs_images()
