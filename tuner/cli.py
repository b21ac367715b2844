"""The ``tuner`` command line: one subcommand module each under :mod:`tuner.commands`.

With no subcommand it opens the TUI (imported lazily, so the CLI starts fast).
Every user-facing failure ends as one message on stderr: exit code 2 for bad input, 1 for the environment.
"""
from __future__ import annotations

import argparse
import importlib
import shlex
import sys

from tuner import __version__
from tuner.reason import terminal_text

# Each module defines register(subparsers) and sets a ``run(args) -> int`` default.
COMMANDS = ("validate", "recipes", "presets", "plan", "render", "probe", "run", "demo", "data", "merge", "eval",
            "export", "infer", "chat", "serve", "doctor", "adopt")

EXIT_USAGE = 2
EXIT_ENVIRONMENT = 1

# What each command imports beyond the torch-free core (validate, plan, render, recipes, presets, doctor), by module:
# checked before the command runs (nothing written, no traceback), so a core-only install says what to install.
_MODELS = ("torch", "transformers", "peft")
_TRAINING = (*_MODELS, "accelerate", "datasets", "trl")
NEEDS = {
    None: ("textual", "ruamel.yaml"),  # the TUI (the wizard saves a recipe in place through ruamel.yaml)
    "run": _TRAINING, "probe": _TRAINING, "demo": (*_TRAINING, "lm_eval"), "eval": (*_MODELS, "datasets", "lm_eval"),
    "data": (*_MODELS, "datasets"), "merge": _MODELS, "export": _MODELS, "infer": _MODELS, "chat": _MODELS,
    "serve": _MODELS, "serve --print": ("transformers",),  # printing the vllm command reads only a tokenizer
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command`` (a subcommand's name), only that subcommand's parser is built.

    A subcommand's usage, help and errors do not depend on its siblings, so ``tuner plan ...`` need not import and
    build the eleven others (about 20 ms); anything else (``--help``, a misspelt command) gets the whole parser.
    """
    parser = argparse.ArgumentParser(
        prog="tuner",
        description="Declarative fine-tuning that plans GPU memory before it runs. Without a command, opens the TUI.",
    )
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in (command,) if command in COMMANDS else COMMANDS:
        importlib.import_module(f"tuner.commands.{name}").register(subparsers)
    return parser


def user_errors() -> tuple[type[Exception], ...]:
    """Exception types whose message is meant for the user as is."""
    from tuner.data.chat_template import TemplateRefused
    from tuner.data.sources import DataError
    from tuner.export import ExportRefused
    from tuner.loading.model import ModelLoadError
    from tuner.recipe.source import RecipeError
    from tuner.rundir.checkpoints import CheckpointRefused
    from tuner.rundir.lock import RunLocked

    return RecipeError, CheckpointRefused, DataError, ModelLoadError, RunLocked, ExportRefused, TemplateRefused


def environment_errors() -> tuple[type[Exception], ...]:
    """Exception types that say, in words meant for the user, what this machine or its network lacks."""
    from tuner.catalog.hub import HubError

    return (HubError,)


# the arguments that name a file or folder: read (hidden characters refused) or written (~ expanded, $VAR refused)
READ_PATHS = ("recipe", "model", "adapter", "offload_folder", "include_path", "run_dir", "input", "write")
WRITTEN_PATHS = ("output", "dest")


def path_argument_problem(args) -> str | None:
    """What is wrong with a path argument, naming it; the folders to write are made what the user meant (``~``)."""
    from tuner.fileio import hidden_character_problem, output_folder

    for dest in (*READ_PATHS, *WRITTEN_PATHS):
        value = getattr(args, dest, None)
        if not isinstance(value, str):
            continue
        try:
            if dest in WRITTEN_PATHS:
                setattr(args, dest, output_folder(value))
            elif problem := hidden_character_problem(value):
                raise ValueError(problem)
        except ValueError as exc:
            shown = dest.upper() if dest in ("recipe", "run_dir", "dest") else \
                "-o/--output" if dest == "output" else f"--{dest.replace('_', '-')}"
            return f"{shown}: {exc} (got {ascii(value)})"
    return None


def _importable(module: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or one whose import was blocked
        return False


def missing_packages_message(command: str | None, modules: list[str]) -> str:
    """One line: what ``tuner COMMAND`` needs that is not installed, as the pip command that installs it, with the
    ranges tuner declares (a core-only install is tuner's wheel with ``--no-deps`` and six packages, README)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        declared = [Requirement(line) for line in requires("tuner") or ()]
    except PackageNotFoundError:  # run from a checkout that is not installed
        declared = []
    specs = {canonicalize_name(r.name): f"{r.name}{r.specifier}" for r in declared if not r.marker}
    wanted = dict.fromkeys(specs.get(canonicalize_name(module), module) for module in modules)
    what = f"tuner {command}" if command else "tuner's terminal UI"
    return (f"{what} needs packages not installed here (a core-only install validates, plans and renders): "
            f"pip install {' '.join(shlex.quote(spec) for spec in wanted)}")


def _print_error(message: str) -> None:
    print(f"error: {terminal_text(message)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    args.argv = list(argv)  # as typed: what `--tp N` or `--pp N` runs again on each rank
    needs = NEEDS.get("serve --print" if getattr(args, "print_command", None) else args.command, ())
    missing = [name for name in needs if not _importable(name)]
    if missing:
        _print_error(missing_packages_message(args.command, missing))
        return EXIT_ENVIRONMENT
    problem = path_argument_problem(args)
    if problem:
        _print_error(problem)
        return EXIT_USAGE
    try:
        if args.command is None:
            from tuner.tui.app import run_app

            return run_app()
        return args.run(args)
    except ModuleNotFoundError as exc:  # a package NEEDS does not list (tuner's own modules are bugs: raised)
        package = (exc.name or "tuner").partition(".")[0]
        if package == "tuner":
            raise
        _print_error(missing_packages_message(args.command, [package]))
        return EXIT_ENVIRONMENT
    except user_errors() as exc:
        _print_error(str(exc))
        return EXIT_USAGE
    except environment_errors() as exc:  # the hub cannot be reached, refuses the model, or the disk is too small
        _print_error(str(exc))
        return EXIT_ENVIRONMENT
    except OSError as exc:  # disk full, read-only or foreign directory: the machine, not the recipe
        from tuner.disk_messages import os_error_message

        _print_error(os_error_message(exc))
        return EXIT_ENVIRONMENT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a full disk in a library's words (torch.save, safetensors); anything else is a bug
        from tuner.disk_messages import disk_full, disk_full_message

        if not disk_full(exc):
            raise
        written = next((getattr(args, dest) for dest in ("output", "dest", "run_dir") if getattr(args, dest, None)), ".")
        _print_error(disk_full_message(written, exc))
        return EXIT_ENVIRONMENT


if __name__ == "__main__":
    sys.exit(main())
