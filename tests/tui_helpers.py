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
