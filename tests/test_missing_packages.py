"""A command that needs a package this environment lacks (the wizard without textual, `tuner demo` without datasets
or torch, as in a core-only install) ends with one line naming what to install, exit 1, before anything is written;
never ModuleNotFoundError.  A package is made missing the way Python itself refuses one: ``sys.modules[name] = None``
makes every later import of it raise ModuleNotFoundError and ``find_spec`` answer None.  The core-only install on
Python 3.12/3.13 itself: tests/test_wheel.py."""
from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.cli import EXIT_ENVIRONMENT, NEEDS, main

ARGS = {None: [], "run": ["run", "demo"], "probe": ["probe", "demo"], "demo": ["demo"], "eval": ["eval", "demo"],
        "data": ["data", "preview", "demo"], "merge": ["merge", "demo"], "export": ["export", "demo"],
        "infer": ["infer", "demo", "--prompt", "x"], "chat": ["chat", "demo"], "serve": ["serve", "demo"],
        "serve --print": ["serve", "llama3.1/8b-lora", "--print", "vllm"]}


@contextlib.contextmanager
def missing(*modules: str):
    """``modules`` not importable while inside (each import of them fails as for a package not installed)."""
    before = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(dict.fromkeys(modules))
    try:
        yield
    finally:
        for name, module in before.items():
            if module is None:
                del sys.modules[name]
            else:
                sys.modules[name] = module


def run_cli(args: list[str]) -> tuple[int, str, list[str]]:
    """``tuner ARGS`` in a fresh folder: exit code, stderr, and what the command left in the folder."""
    err = io.StringIO()
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder), contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
        left = os.listdir(folder)
    return code, err.getvalue(), left


def test_every_command_beyond_the_core_is_listed():
    assert set(ARGS) == set(NEEDS)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(NEEDS, key=str)).flatmap(
    lambda command: st.tuples(st.just(command), st.sets(st.sampled_from(NEEDS[command]), min_size=1))))
def test_a_missing_package_is_one_line_naming_it_before_anything_is_written(case):
    command, hidden = case
    with missing(*hidden):
        code, err, left = run_cli(ARGS[command])
    assert code == EXIT_ENVIRONMENT, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert "pip install" in err and all(module in err for module in hidden), err
    present = set(NEEDS[command]) - hidden
    assert not any(f" '{module}" in err or f" {module}" in err.split("pip install")[1] for module in present), err
    assert left == [], "checked before anything is written"
