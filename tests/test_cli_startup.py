"""Subcommands load lazily: ``tuner --help`` imports none of the libraries a subcommand needs, and ``tuner plan``
only what planning needs. The modules are those the real command's process holds when it exits; the times
themselves are measured by benchmarks/cli_startup.py, not here."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

HEAVY = ("torch", "transformers", "datasets", "textual", "accelerate", "peft")


def imported_by(*args: str) -> set[str]:
    """Every module a ``tuner ARGS`` process imported (``python -m tuner``, the modules listed as it exits)."""
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print('MODULES', *sorted(sys.modules), file=sys.stderr))\n"
            f"sys.argv = ['tuner', *{list(args)!r}]\n"
            "runpy.run_module('tuner', run_name='__main__', alter_sys=True)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    return set(result.stderr.split("MODULES ")[-1].split())


def test_help_imports_no_subcommand_library():
    modules = imported_by("--help")
    assert "tuner.commands.plan" in modules  # the list is real: every subcommand's parser was built
    loaded = {name.split(".")[0] for name in modules} & {*HEAVY, "pydantic", "yaml", "rich", "huggingface_hub"}
    assert loaded == set()


def test_plan_imports_only_what_planning_needs():
    modules = imported_by("plan", "llama3.1/8b-lora")
    assert {"pydantic", "tuner.planner.memory", "rich.table"} <= modules
    assert {name.split(".")[0] for name in modules} & set(HEAVY) == set()
    unneeded = {"rich.progress", "tuner.launch.run", "huggingface_hub.file_download"} & modules
    assert unneeded == set()
