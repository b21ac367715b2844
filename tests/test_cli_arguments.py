"""Every argument is checked by the command line itself (argparse types and ranges, from the recipe schema where the
argument sets a recipe field): a bad value is argparse's usage line and one error naming the argument, exit code 2,
before a recipe is read or a model loaded; never a traceback from the library it would have reached."""
from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from tuner.cli import build_parser, main


def run_cli(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


BAD_ARGUMENTS = [
    (["infer", "demo", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens", "greater than or equal to 1"),
    (["infer", "demo", "--prompt", "hi", "--max-new-tokens", "ten"], "--max-new-tokens", "valid integer"),
    (["infer", "demo", "--prompt", "hi", "--temperature", "-1"], "--temperature", "greater than 0"),
    (["infer", "demo", "--prompt", "hi", "--temperature", "nan"], "--temperature", ""),
    (["infer", "demo", "--prompt", "hi", "--top-p", "1.5"], "--top-p", "less than or equal to 1"),
    (["infer", "demo", "--prompt", "hi", "--context", "-5"], "--context", "greater than or equal to 1"),
    (["infer", "demo", "--prompt", "hi", "--tp", "0"], "--tp", "greater than or equal to 1"),
    (["infer", "demo", "--input", "p.jsonl", "--output", "a.jsonl", "--batch-size", "0"], "--batch-size",
     "greater than or equal to 1"),
    (["infer", "demo", "--prompt", "hi", "--max-memory", "gpu0=lots"], "--max-memory", "DEVICE=SIZE"),
    (["infer", "demo", "--prompt", "\udcff\udcfe"], "--prompt", "not UTF-8"),
    (["chat", "demo", "--max-new-tokens", "0"], "--max-new-tokens", "greater than or equal to 1"),
    (["chat", "demo", "--system", "\udcff"], "--system", "not UTF-8"),
    (["data", "preview", "demo", "-n", "0"], "-n/--count", "greater than or equal to 1"),
    (["plan", "--model", "builtin:demo", "--seq", "0"], "--seq", "greater than or equal to 8"),
    (["plan", "--model", "builtin:demo", "--batch", "0"], "--batch", "greater than or equal to 1"),
    (["plan", "--model", "builtin:demo", "--gpus", "0xA100-80GB"], "--gpus", "1 to 64 GPUs"),
    (["plan", "--model", "builtin:demo", "--gpus", "x"], "--gpus", "N x GPU"),
]


@pytest.mark.parametrize("args, argument, fragment", BAD_ARGUMENTS, ids=[" ".join(a[0][:1] + a[0][-2:]) for a in BAD_ARGUMENTS])
def test_a_bad_argument_is_refused_by_the_command_line(args, argument, fragment) -> None:
    code, err = run_cli(*args)
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith("usage: tuner "), err
    assert f"error: argument {argument}: " in err and fragment in err, err


def _numeric_arguments(parser: argparse.ArgumentParser, prefix: str = "tuner"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _numeric_arguments(sub, f"{prefix} {name}")
        elif action.type in (int, float) and not action.choices:
            yield f"{prefix} {'/'.join(action.option_strings) or action.dest}"


def test_every_number_on_the_command_line_has_a_range() -> None:
    """A plain int/float type accepts 0, negatives, nan and inf: each numeric argument needs a checked type."""
    assert list(_numeric_arguments(build_parser())) == []


@pytest.mark.slow
def test_chat_reads_a_message_that_is_not_utf8_as_a_mistake_not_a_crash(demo_model_path) -> None:
    """`printf '\\xff\\xfe\\n' | tuner chat RUN`: the message is refused with its number, the next one answered."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    result = subprocess.run([sys.executable, "-m", "tuner", "chat", "--model", str(demo_model_path), "--max-new-tokens",
                             "2", "--greedy"], input=b"\xff\xfe\nreverse\\\nab\n", capture_output=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    err = result.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    assert "message 1 is not UTF-8 text (byte 0xff); not sent" in err, err
    assert result.stdout.strip(), "the next message is answered"
    assert result.returncode == 2  # a piped conversation with a bad message says so in its exit code
