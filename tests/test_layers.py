"""The core (schema, planner, renderers, argv) imports neither torch nor textual."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

CORE_MODULES = [
    "tuner.recipe", "tuner.recipe.registry", "tuner.recipe.docs", "tuner.catalog.gpus", "tuner.events",
    "tuner.render.run_directory", "tuner.render.presets", "tuner.launch.argv", "tuner.launch.preflight", "tuner.cli",
    "tuner.planner", "tuner.catalog.models", "tuner.launch.runner", "tuner.launch.session", "tuner.doctor",
    "tuner.commands.plan", "tuner.commands.run",
]


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_no_torch_or_textual(module):
    code = (f"import sys, json, {module}; "
            "print(json.dumps([m for m in ('torch', 'textual', 'transformers') if m in sys.modules]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
