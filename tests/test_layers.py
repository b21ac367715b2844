"""The floors hold: import-linter's layers contract passes, docs/architecture.md lists the same floors, and the
core (schema, planner, renderers, launcher) imports neither torch nor textual."""
from __future__ import annotations

import json
import os
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


CONTRACTS = {"tuner": "floors", "tuner.catalog": "catalog"}  # container -> the word its docs block is named by


def contract(container: str = "tuner") -> dict:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (found,) = [each for each in config["contracts"] if each["containers"] == [container]]
    return found


def contract_floors(container: str = "tuner") -> list[str]:
    return contract(container)["layers"]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is a test dependency: pip install -e '.[test]'"
    return subprocess.run([lint, "--no-cache"], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})


def test_imports_point_down_only():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"{len(CONTRACTS)} kept, 0 broken" in result.stdout


def test_the_catalog_circle_stays_broken(tmp_path):
    """The six catalog modules that imported each other in a circle (facts, inventory, meta_inventory, models, hub,
    layer_kinds) now form a one-way path; each former back-edge, put back inside a function where Python would
    let it run, breaks the contract again."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "tuner", copy / "tuner", ignore=shutil.ignore_patterns("__pycache__", "inventories"))
    shutil.copy(REPO / "pyproject.toml", copy)
    back_edges = {"inventory": "facts", "meta_inventory": "models", "hub": "models", "inventory_store": "facts",
                  "layer_kinds": "facts", "model_config": "hub"}
    for lower, upper in back_edges.items():
        path = copy / "tuner" / "catalog" / f"{lower}.py"
        path.write_text(path.read_text() + f"\n\ndef _back_edge():\n    import tuner.catalog.{upper}  # noqa\n")
    result = lint_imports(copy)
    assert result.returncode != 0
    for lower, upper in back_edges.items():
        assert f"tuner.catalog.{lower} -> tuner.catalog.{upper}" in result.stdout, (lower, upper, result.stdout[-3000:])


@pytest.mark.parametrize("container", sorted(CONTRACTS))
def test_architecture_doc_lists_the_contract_floors(container):
    doc = (REPO / "docs" / "architecture.md").read_text()
    word = CONTRACTS[container]
    block = re.search(rf"<!-- {word}: from pyproject.toml -->\n```\n(.*?)```", doc, re.S)
    assert block, f"docs/architecture.md must hold the {word} block"
    listed = [line.split("#")[0].strip() for line in block[1].splitlines() if line.split("#")[0].strip()]
    assert listed == contract_floors(container)


@pytest.mark.parametrize("container", sorted(CONTRACTS))
def test_every_module_sits_on_a_floor(container):
    """exhaustive = true makes import-linter fail on a new module no floor names; keep it so."""
    assert contract(container)["exhaustive"] is True
    named = {name.strip() for floor in contract_floors(container) for name in re.split(r"[|:]", floor)}
    folder = REPO.joinpath(*container.split("."))
    modules = {path.stem if path.is_file() else path.name for path in folder.iterdir()
               if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()}
    assert modules == named


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_no_torch_or_textual(module):
    code = (f"import sys, json, {module}; "
            "print(json.dumps([m for m in ('torch', 'textual', 'transformers') if m in sys.modules]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
