"""Subcommands load lazily: ``tuner --help`` imports none of the libraries a subcommand needs, and ``tuner plan``
only what planning needs. The modules are those the real command's process holds when it exits; the times
themselves are measured by benchmarks/cli_startup.py, not here."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
from conftest import REPO

from tuner.cli import COMMANDS, build_parser

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
    other_commands = {f"tuner.commands.{name}" for name in COMMANDS if name != "plan"}
    assert other_commands & modules == set()  # only plan's own parser was built


def answers(parser, argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of argparse's own answer to ``argv`` (help or a usage error)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        parser.parse_args(argv)
    return exited.value.code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_subcommand_parser_built_alone_answers_as_in_the_whole_command_line(command):
    """``tuner COMMAND ...`` builds only that subcommand's parser; its help and usage errors stay the same."""
    for argv in ([command, "--help"], [command, "--no-such-option"]):
        assert answers(build_parser(command), argv) == answers(build_parser(), argv)
