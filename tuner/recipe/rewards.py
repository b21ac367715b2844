"""The rewards of a grpo recipe as the recipe states them: which fields each kind reads, and a user reward's file.

A user reward is ``path/to/file.py:name``, the path relative to the recipe's folder.  Nothing here runs that file:
the checks read it as text (:mod:`ast`) to find the function, and only the training entrypoint imports it
(:mod:`tuner.train.rewards`), because the recipe names it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from tuner.fileio import user_path
from tuner.rundir.layout import FINAL_DIR, LOCK_FILE

# the fields each kind of reward reads beside kind and weight (the others are refused, naming the kind)
REWARD_FIELDS = {
    "exact_match": ("column",),
    "regex_match": ("column", "pattern"),
    "format": ("pattern",),
    "length": ("target_tokens",),
    "math": ("column",),
    "think_format": (),
    "function": ("function",),
    "model": ("model",),
}
REQUIRED_FIELDS = {"exact_match": ("column",), "regex_match": ("column", "pattern"), "format": ("pattern",),
                   "math": ("column",),
                   "function": ("function",), "model": ("model",)}
OPTIONAL_FIELDS = ("column", "pattern", "target_tokens", "function", "model")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def split_function(spec: str) -> tuple[str, str]:
    """``path/to/file.py:name`` as (path, name); the name is what follows the last colon."""
    path, _, name = spec.rpartition(":")
    return path, name


def resolve_reward_paths(data: Any, folder: Path) -> None:
    """Make every relative ``function`` path of the recipe data absolute against ``folder`` (the recipe's), and every
    reward ``model`` that names a tuner run directory name the model that run saved (its final/), in place;
    anything not shaped like a reward list is left for the schema to refuse."""
    grpo = (data.get("objective") or {}).get("grpo") if isinstance(data, dict) and isinstance(
        data.get("objective"), dict) else None
    rewards = grpo.get("rewards") if isinstance(grpo, dict) else None
    for reward in rewards if isinstance(rewards, list) else []:
        model = reward.get("model") if isinstance(reward, dict) else None
        run = user_path(model) if isinstance(model, str) and model else None
        if run is not None and (run / LOCK_FILE).is_file() and (run / FINAL_DIR).is_dir():
            reward["model"] = str(run / FINAL_DIR)
        spec = reward.get("function") if isinstance(reward, dict) else None
        if isinstance(spec, str) and ":" in spec:
            path, name = split_function(spec)
            if path and not Path(path).expanduser().is_absolute():
                reward["function"] = f"{(folder / path).resolve()}:{name}"


def _function_problem(spec: str) -> str | None:
    path, name = split_function(spec)
    if not path or not _NAME.match(name):
        return f"{spec!r} must be path/to/file.py:function_name (the file relative to the recipe's folder)"
    file = Path(path).expanduser()
    if file.suffix != ".py":
        return f"{path} is not a Python file (.py)"
    if not file.is_file():
        return f"{file}: no such file; the path is relative to the recipe's folder"
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except (OSError, UnicodeDecodeError) as exc:
        return f"{file}: cannot read it ({exc})"
    except SyntaxError as exc:
        return f"{file}:{exc.lineno}: not valid Python: {exc.msg}"
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if name not in defined:
        listed = ", ".join(defined) or "none"
        return f"{file} defines no top-level function {name!r} (its functions: {listed})"
    return None


def reward_problems(reward) -> list[tuple[str, str]]:
    """(field of the reward, message) for every way one reward section cannot be used."""
    kind = reward.kind
    problems = []
    for field in OPTIONAL_FIELDS:
        value = getattr(reward, field)
        if value is None and field in REQUIRED_FIELDS.get(kind, ()):
            needs = {"column": "the data column with each prompt's expected answer",
                     "pattern": "a regular expression", "function": "path/to/file.py:function_name",
                     "model": "a reward model's directory or hub id"}[field]
            problems.append((field, f"a {kind} reward needs {field}: {needs}."))
        elif value is not None and field not in REWARD_FIELDS[kind]:
            problems.append((field, f"a {kind} reward does not read {field}: remove it (it reads "
                                    f"{', '.join(REWARD_FIELDS[kind]) or 'nothing more'})."))
    if reward.pattern is not None and "pattern" in REWARD_FIELDS[kind]:
        try:
            re.compile(reward.pattern)
        except re.error as exc:
            problems.append(("pattern", f"not a regular expression: {exc}."))
    if reward.function is not None and kind == "function":
        problem = _function_problem(reward.function)
        if problem:
            problems.append(("function", problem + "."))
    return problems


def reward_name(reward) -> str:
    """How logs and messages name a reward: its kind and the column it reads (``exact_match(answer)``), the
    function's name, or the reward model's folder (its run directory's, for a run's final/)."""
    if reward.kind == "function":
        return split_function(reward.function)[1]
    if reward.kind == "model":  # a tuner run's final/ is named by its run directory
        path = Path(reward.model)
        return (path.parent.name if path.name == FINAL_DIR else path.name) or reward.model
    return f"{reward.kind}({reward.column})" if reward.column else reward.kind


def reward_names(rewards) -> list[str]:
    """:func:`reward_name` of each reward, made distinct by position where two would read the same (TRL logs each
    reward under its name)."""
    names = [reward_name(reward) for reward in rewards]
    return [f"{name}#{index + 1}" if names.count(name) > 1 else name for index, name in enumerate(names)]
