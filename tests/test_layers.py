"""The floors hold: import-linter's layers contract passes, docs/architecture.md lists the same floors, and the
core (schema, planner, renderers, launcher) imports neither torch nor textual."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

import tomllib

CORE_MODULES = [
    "tuner.recipe", "tuner.recipe.registry", "tuner.recipe.docs", "tuner.catalog.gpus", "tuner.catalog.demo",
    "tuner.rundir.events", "tuner.render.run_directory", "tuner.render.presets", "tuner.render.launch_command",
    "tuner.launch.run", "tuner.rundir.checkpoints", "tuner.rundir.checkpoints", "tuner.rundir.summary", "tuner.rundir.lock", "tuner.cli", "tuner.planner", "tuner.catalog.models", "tuner.catalog.hub", "tuner.launch.runner",
    "tuner.doctor", "tuner.commands.plan", "tuner.commands.run", "tuner.data.sources",
]


def contract_floors() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = config["contracts"]
    return contract["layers"]


def test_imports_point_down_only():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is a test dependency: pip install -e '.[test]'"
    result = subprocess.run([lint, "--no-cache"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def test_architecture_doc_lists_the_contract_floors():
    doc = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"<!-- floors: from pyproject.toml -->\n```\n(.*?)```", doc, re.S)
    assert block, "docs/architecture.md must hold the floors block"
    listed = [line.split("#")[0].strip() for line in block[1].splitlines() if line.split("#")[0].strip()]
    assert listed == contract_floors()


def test_every_module_sits_on_a_floor():
    """exhaustive = true makes import-linter fail on a new top-level module no floor names; keep it so."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["contracts"][0]["exhaustive"] is True
    named = {name.strip() for floor in contract_floors() for name in re.split(r"[|:]", floor)}
    top_level = {path.stem if path.is_file() else path.name for path in (REPO / "tuner").iterdir()
                 if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()}
    assert top_level == named


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_no_torch_or_textual(module):
    code = (f"import sys, json, {module}; "
            "print(json.dumps([m for m in ('torch', 'textual', 'transformers') if m in sys.modules]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
