"""Property-based fuzzing of recipe files and ``--set`` overrides through the real CLI.

Every case must end in exit code 0 (a valid recipe) or 2 with one paragraph on stderr that
starts at the file (and line) or the ``--set`` that caused it; never a traceback, and
``tuner render`` never leaves a run directory behind for a bad recipe.

The number of cases scales with ``TUNER_FUZZ_EXAMPLES`` (examples per property, default 150);
the total tried is printed at the end and kept in pytest's cache (``pytest --cache-show tuner/fuzz``).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from render_cases import CASES as TOPOLOGIES

from tuner.cli import build_parser, main
from tuner.recipe.io import load_recipe, recipe_to_yaml
from tuner.recipe.registry import builtin_path
from tuner.recipe.schema import Recipe

pytestmark = pytest.mark.xdist_group("fuzz")  # one worker, in order: the last test reports the count

EXAMPLES = int(os.environ.get("TUNER_FUZZ_EXAMPLES", "150"))
settings.register_profile(
    "tuner-fuzz", max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("tuner-fuzz")
CASES: Counter[str] = Counter()  # cases tried, per property
REACHED: Counter[str] = Counter()  # how deep the well-typed ones got
SECTIONS = tuple(Recipe.model_fields)


def _field_paths(model: type[BaseModel] = Recipe, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every leaf field of the schema as a key path, e.g. ('memory', 'fsdp', 'sharding_strategy')."""
    import typing

    paths = []
    for name, info in model.model_fields.items():
        nested = [arg for arg in (info.annotation, *typing.get_args(info.annotation))
                  if isinstance(arg, type) and issubclass(arg, BaseModel)]
        paths.extend(_field_paths(nested[0], prefix + (name,)) if nested else [prefix + (name,)])
    return paths


FIELD_PATHS = _field_paths()
# The fully resolved demo recipe: every field sits on its own line, so every error has a line to point at.
RESOLVED_DEMO = load_recipe(builtin_path("demo")).model_dump(mode="json")


def run_cli(*args: str) -> tuple[int, str, str]:
    """``tuner ARGS`` in this process (fast); argparse's SystemExit becomes the exit code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, err: str, where: str | None = None) -> None:
    """Exit 0, or exit 2 with one paragraph that starts at ``where`` (a regex); never a traceback."""
    assert code in (0, 2), f"exit code {code}: {err}"
    if code == 0:
        return
    assert "Traceback" not in err, err
    if err.startswith("usage: "):  # argparse's own report, e.g. --set followed by a value starting with '-'
        assert re.match(r"tuner( \w+)*: error: \S", err.rstrip().splitlines()[-1]), err  # usage lines, one error
        return
    assert err.startswith("error: "), err
    assert err.strip() and "\n\n" not in err.strip(), f"not one paragraph: {err!r}"
    if where is not None:
        assert re.match(rf"error: {where}", err), f"message does not start at {where}: {err!r}"


# -- strategies ---------------------------------------------------------------------------------------------

NASTY_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "~", "null", "no", "yes", "on", "0x1F", "0o17", "1_000", "1e400", "-1e400", ".nan",
                     ".inf", "-.inf", "2001-01-01", "0000-01-01", "9" * 5000, "$(rm -rf ~)", "a;b", "'", '"',
                     "\u202e", "\x00", "\ud800", "\n", "- a", "{a: 1}", "[1, 2", "&a [*a]", "!!python/object:os.system",
                     "all-linear", "builtin:demo", "deepspeed", "A100-80GB", "48GB", "auto", "bf16", "fp16"]),
)
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=-2**70, max_value=2**70), st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True), NASTY_TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.one_of(st.sampled_from(SECTIONS), st.text(max_size=8)), children, max_size=4)),
    max_leaves=12,
)


def _set_path(data: dict, path: tuple[str, ...], value) -> dict:
    target = data
    for part in path[:-1]:
        if not isinstance(target.get(part), dict):
            target[part] = {}
        target = target[part]
    target[path[-1]] = value
    return data


@st.composite
def mutated_recipes(draw) -> tuple[dict, list[tuple[str, ...]]]:
    """The resolved demo recipe with one to three fields given random values (the most realistic mistakes)."""
    import copy

    data = copy.deepcopy(RESOLVED_DEMO)
    paths = draw(st.lists(st.sampled_from(FIELD_PATHS), min_size=1, max_size=3, unique=True))
    for path in paths:
        _set_path(data, path, draw(VALUES))
    return data, paths


def _typed_values(annotation, metadata) -> st.SearchStrategy:
    """Values a field's type accepts (bounds included), so recipes get past type checks into the cross-field
    rules, the planner and the renderers."""
    import types
    import typing

    bounds = {name: getattr(item, name) for item in metadata for name in ("ge", "gt", "le", "lt") if hasattr(item, name)}
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_typed_values(arg, metadata) for arg in typing.get_args(annotation)))
    if origin is typing.Literal:
        return st.sampled_from(typing.get_args(annotation))
    if annotation is type(None):
        return st.none()
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        low = bounds.get("ge", bounds.get("gt", -1) + 1) if ("ge" in bounds or "gt" in bounds) else -(2**40)
        high = bounds.get("le", 2**40)
        return st.one_of(st.integers(low, min(high, low + 8)), st.integers(low, high))
    if annotation is float:
        low, high = bounds.get("ge", bounds.get("gt", -1e9)), bounds.get("le", bounds.get("lt", 1e9))
        return st.floats(low, high, exclude_min="gt" in bounds, exclude_max="lt" in bounds, allow_nan=False)
    if origin is list:
        return st.lists(st.sampled_from(["q_proj", "v_proj", "o_proj", "gate_proj", "lm_head"]), min_size=1, max_size=3)
    return NASTY_TEXT


def _field_info(path: tuple[str, ...]):
    import typing

    model = Recipe
    for part in path[:-1]:
        annotation = model.model_fields[part].annotation
        model = next(arg for arg in (annotation, *typing.get_args(annotation)) if isinstance(arg, type) and issubclass(arg, BaseModel))
    return model.model_fields[path[-1]]


@st.composite
def well_typed_recipes(draw) -> dict:
    """The resolved demo recipe with up to eight fields set to values of the right type and range."""
    import copy

    data = copy.deepcopy(RESOLVED_DEMO)
    for path in draw(st.lists(st.sampled_from(FIELD_PATHS), min_size=1, max_size=8, unique=True)):
        info = _field_info(path)
        _set_path(data, path, draw(_typed_values(info.annotation, info.metadata)))
    return data


def _anchor_bomb(depth: int, width: int) -> str:
    lines = ['a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, depth)]
    return "\n".join(lines) + "\n"


YAML_TRICKS = st.one_of(
    st.builds(_anchor_bomb, st.integers(1, 12), st.integers(1, 12)),
    st.sampled_from([
        "a: &a [*a]\n", "model: &m {id: x, more: *m}\n", "model: {id: x}\nmodel: {id: y}\n",
        "memory:\n  micro_batch_size: 1\n  micro_batch_size: 2\n", "? [1, 2]\n: 3\n", "? {a: 1}\n: 2\n",
        "1: 2\n", "null: 1\n", "yes: 1\n", "2001-01-01: x\n", "model: !!python/object/apply:os.system [ls]\n",
        "name: !!binary aGVsbG8=\n", "name: !!set {a, b}\n", "model: !!omap [id: x]\n", "name: !!float 1\n",
        "base: &b {micro_batch_size: 4}\nmemory:\n  <<: *b\n", "<<: {name: merged}\n", "memory: {<<: [1, 2]}\n",
        "name: a\n---\nname: b\n", "%YAML 1.1\n---\nname: a\n", "%TAG ! tag:x.org,2002:\n---\nname: !foo x\n",
        "\ufeffname: bom\n", "name: '\\x00'\n", 'name: "\\ud800"\n', "name: \"\\x00\"\n", "\t name: tab\n",
        "a: " + "[" * 3000 + "]" * 3000 + "\n", "a:" + "\n".join(" " * i + f"k{i}:" for i in range(1, 60)) + "\n",
        "training: {seed: " + "1" * 5000 + "}\n", "model: {revision: 0000-01-01}\n", "- model\n- hardware\n", "42\n",
        "''\n", "...\n", "---\n", "# only a comment\n", "name: [unclosed\n", "name: 'unclosed\n", "model:\n\tid: x\n",
    ]),
)


# -- properties ---------------------------------------------------------------------------------------------

def _validate_text(body: bytes | str, tmp: Path) -> tuple[int, str, Path]:
    path = tmp / "recipe.yaml"
    path.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass"))
    code, _, err = run_cli("validate", "-q", str(path))
    return code, err, path


@FUZZ
@given(data=mutated_recipes())
def test_mutated_fields_name_the_field_and_line(data) -> None:
    recipe, _ = data
    CASES["mutated fields"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        text = yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True)
        code, err, path = _validate_text(text, Path(tmp))
        # a cross-field rule may blame a partner field, but always a field of the recipe, at its line
        assert_clean(code, err, rf"{re.escape(str(path))}:\d+: ({'|'.join(SECTIONS)})\b")


@FUZZ
@given(document=VALUES)
def test_random_structures(document) -> None:
    CASES["random structures"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        code, err, path = _validate_text(yaml.safe_dump(document, allow_unicode=True), Path(tmp))
        assert_clean(code, err, re.escape(str(path)))


@FUZZ
@given(body=st.one_of(st.binary(max_size=200), st.text(max_size=200), YAML_TRICKS,
                      st.builds(lambda tail: recipe_to_yaml(Recipe()).encode() + tail, st.binary(max_size=20))))
def test_raw_files_and_yaml_tricks(body) -> None:
    CASES["raw bytes and YAML tricks"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        code, err, path = _validate_text(body if isinstance(body, bytes) else body, Path(tmp))
        assert_clean(code, err, re.escape(str(path)))


OVERRIDE_KEYS = st.one_of(
    st.sampled_from([".".join(path) for path in FIELD_PATHS]),
    st.sampled_from(SECTIONS),
    st.text(max_size=20),
    st.builds(lambda path, extra: ".".join(path) + "." + extra, st.sampled_from(FIELD_PATHS), st.text(max_size=5)),
)


@FUZZ
@given(overrides=st.lists(st.builds(lambda key, value: f"{key}={value}", OVERRIDE_KEYS, NASTY_TEXT), min_size=1, max_size=3))
def test_set_overrides(overrides) -> None:
    CASES["--set overrides"] += 1
    args = [arg for override in overrides for arg in ("--set", override)]
    code, _, err = run_cli("validate", "-q", "demo", *args)
    demo = re.escape(str(builtin_path("demo")))
    assert_clean(code, err, rf"(--set \S|{demo}:\d+: )")


@FUZZ
@given(data=mutated_recipes())
def test_render_leaves_no_run_directory_for_a_bad_recipe(data) -> None:
    recipe, _ = data
    CASES["render"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True), encoding="utf-8")
        run_dir = Path(tmp) / "run"
        code, _, err = run_cli("render", str(path), "-o", str(run_dir))
        assert_clean(code, err)
        if code == 2:
            assert not run_dir.exists(), f"a rejected recipe left {sorted(run_dir.iterdir())}"
        else:
            files = sorted(p.name for p in run_dir.iterdir())  # a CPU recipe on several machines adds slurm.sbatch
            assert files in (["accelerate.yaml", "launch.sh", "recipe.lock.yaml", "tuner_files.json"],
                             ["accelerate.yaml", "launch.sh", "recipe.lock.yaml", "slurm.sbatch", "tuner_files.json"])


PLAN_MODELS = st.sampled_from(["builtin:demo", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B", "acme/unknown-7b"])


@FUZZ
@given(recipe=well_typed_recipes(), model=PLAN_MODELS, advise=st.sampled_from([False, False, False, True]))
def test_well_typed_recipes_validate_plan_and_render_or_name_a_field(recipe, model, advise) -> None:
    """Right types in random combinations reach the cross-field rules, the planner and the renderers:
    each says no with a field and a line, or works (plan exit 1 = does not fit)."""
    CASES["well-typed: validate, plan, render"] += 1
    recipe.setdefault("model", {})
    if isinstance(recipe["model"], dict):
        recipe["model"]["id"] = model
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True), encoding="utf-8")
        code, _, err = run_cli("validate", "-q", str(path))
        assert_clean(code, err, rf"{re.escape(str(path))}:\d+: ({'|'.join(SECTIONS)})\b")
        if code != 0:
            return
        REACHED["valid, then planned and rendered"] += 1
        code, _, err = run_cli("plan", str(path), "--json", *(["--advise"] if advise else []))
        assert code in (0, 1, 2), err  # 2: a model without architecture facts offline, named by model.id
        assert_clean(0 if code == 1 else code, err, "model.id: " if code == 2 else None)
        code, _, err = run_cli("render", str(path), "-o", str(Path(tmp) / "run"))
        assert code == 0, err


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)),
    max_leaves=8,
)
SAMPLE_KEYS = st.sampled_from(["text", "instruction", "input", "output", "messages", "role", "content", "prompt"])
JSONL_LINES = st.one_of(
    st.builds(json.dumps, st.dictionaries(SAMPLE_KEYS, JSON_VALUES, max_size=4)),
    st.builds(json.dumps, st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", ""]), "content": JSON_VALUES}), max_size=3)})),
    st.builds(json.dumps, JSON_VALUES),
    st.text(max_size=40),
)


@settings(FUZZ, max_examples=max(10, EXAMPLES // 3))
@example(lines=['{"text": {"\\u0000": {}}}'], data_format="auto", tail=b"")  # datasets' KeyError on decoding
@example(lines=['{"text": {}}'], data_format="auto", tail=b"")  # datasets' Json feature: a dict, not text
@example(lines=['{"messages": [{"role": "user", "content": {}}]}'], data_format="auto", tail=b"")
@example(lines=['{"text": {}}', '{"\\r":null,"\\u0000":null}'], data_format="auto", tail=b"")  # columns \r, NUL
@given(lines=st.lists(JSONL_LINES, max_size=6), data_format=st.sampled_from(["auto", "text", "instruction", "chat"]),
       tail=st.binary(max_size=6))
def test_data_files_end_in_samples_or_a_message_naming_lines(lines, data_format, tail) -> None:
    """Random JSONL through `tuner data preview`: the samples, or exit 2 naming data.source/format and lines."""
    CASES["data files"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.jsonl"
        path.write_bytes("\n".join(lines).encode() + tail)
        code, _, err = run_cli("data", "preview", "demo", "--set", f"data.source={path}", "--set", f"data.format={data_format}",
                               "--set", "data.eval_fraction=0")
        assert "Traceback" not in err, err
        progress = err.rfind("\r")  # datasets' progress bars come first on stderr
        assert_clean(code, err[err.index("\n", progress) + 1:] if progress >= 0 else err, r"data\.(source|format)")


# -- rendered scripts: hostile values in every field a script may show, run under fake launchers -----------------

SHELL_TRICKS = ["$(touch pwned)", "`touch pwned`", "a;touch pwned", "x'; touch pwned; '", '"; touch pwned; "',
                "a\ntouch pwned", "a\rtouch pwned", "fe80::1%$(touch pwned)", "a&&touch pwned", "|touch pwned", "$IFS",
                "!!", "~root", "*", "--help", "-rf", "a b", "%s%n", "{a,b}", "\\", "\u202etouch pwned", "ünï ✓",
                "node-1.cluster", "10.0.0.1", "::1"]
SCRIPT_VALUES = st.one_of(st.sampled_from(SHELL_TRICKS), NASTY_TEXT,
                          st.builds("".join, st.lists(st.sampled_from(SHELL_TRICKS + ["x", "/", "."]), max_size=4)))
SCRIPT_FIELDS = [("output", "dir"), ("hardware", "main_process_ip"), ("name",), ("hardware", "nvme_path"),
                 ("model", "id"), ("data", "source"), ("hardware", "gpu"), ("inference", "offload_folder")]


def _inside(value: str) -> str:
    """A run directory below runs/ however hostile the text: the script, not the file system, is under test."""
    return "runs/" + (value.replace("..", "_.").lstrip("/") or "x")


@settings(FUZZ, max_examples=max(10, EXAMPLES // 3))
@given(topology=st.sampled_from(sorted(TOPOLOGIES)), field=st.sampled_from(SCRIPT_FIELDS), value=SCRIPT_VALUES,
       via_option=st.booleans())
def test_rendered_scripts_run_only_the_launch_command(topology, field, value, via_option) -> None:
    """A hostile value anywhere a script may show it: refused naming the field, or rendered into scripts that, run
    as every machine and as a Slurm job under fake launchers, pass exactly the launch command and run nothing else."""
    import copy

    from fake_launchers import install_fakes, run_rendered_scripts

    CASES["rendered scripts, run"] += 1
    data = {"name": topology, **copy.deepcopy(TOPOLOGIES[topology])}
    if field == ("output", "dir"):
        value = _inside(value)
    options = ["-o", value] if via_option and field == ("output", "dir") else []
    if not options:
        _set_path(data, field, value)
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "recipe.yaml").write_text(yaml.safe_dump(data), encoding="ascii")  # "\\ud800" escaped, as typed
        previous = os.getcwd()
        os.chdir(project)
        try:
            code, _, err = run_cli("render", "recipe.yaml", *options)
        finally:
            os.chdir(previous)
        # refused at a field's line (a cross-field rule may name the partner field), at the -o option itself (its
        # folder checked before the recipe is read), or at render time naming the field (FSDP reads the model's config)
        where = rf"((recipe\.yaml:\d+: |-o/--output: )?({'|'.join(SECTIONS)})\b|-o/--output: \S)"
        assert_clean(code, err, where if code == 2 else None)
        if code != 0:
            return
        REACHED["scripts run"] += 1
        run_dir = value if options else load_recipe(project / "recipe.yaml").output.dir
        recipe = load_recipe(project / run_dir / "recipe.lock.yaml")
        run_rendered_scripts(project, run_dir, recipe, install_fakes(Path(tmp)))


# -- every command's arguments ----------------------------------------------------------------------------------

def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, its parser) for every runnable command, e.g. (("recipes", "cp"), parser)."""
    subs = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _subcommands(sub, path + (name,))


COMMAND_PARSERS = dict(_subcommands(build_parser()))
ARGUMENT_VALUES = st.one_of(
    NASTY_TEXT, st.integers(-3, 100).map(str),
    st.sampled_from(["0", "-1", "1e9", "nan", "inf", "-inf", "1.5", "1e-9", "99999999999999999999", "8xA100-80GB",
                     "0xA100", "65x48GB", "x", "cpu=1GiB", "0=lots", "demo", "demo-lora", "builtin:demo", "recipe.yaml",
                     "runs/demo", "missing.yaml", "folder", "/dev/zero", "prompts.jsonl", "answers.jsonl", ".", "..",
                     "training.micro_batch_size=true", "name=x", "model.id=acme/x", "\udcff"]),
)
PATH_OPTIONS = {"-o", "--output", "--input", "--offload-folder", "--adapter"}
# A value each argument accepts, so that most command lines get past argparse into the command itself.
GOOD_VALUES = {
    "recipe": "demo", "name": "demo", "dest": "copy.yaml", "run_dir": "runs/demo", "overrides": "data.max_samples=8",
    "max_new_tokens": "2", "temperature": "0.7", "top_p": "0.9", "context": "64", "batch_size": "2", "count": "2",
    "seq": "512", "batch": "2", "gpus": "1xA100-80GB", "max_memory": "cpu=2GiB", "model": "builtin:demo",
    "prompt": "reverse\nab", "input": "prompts.jsonl", "output": "out/answers.jsonl", "system": "be brief",
    "offload_folder": "out/offload", "adapter": "runs/demo",
}


def _value(draw, action: argparse.Action) -> str:
    """Mostly a value the argument accepts; one time in four a hostile one."""
    if draw(st.integers(0, 3)):
        if action.choices:
            return draw(st.sampled_from([str(choice) for choice in action.choices]))
        if action.dest in GOOD_VALUES:
            return GOOD_VALUES[action.dest]
    return draw(ARGUMENT_VALUES)


@st.composite
def command_lines(draw) -> list[str]:
    words = draw(st.sampled_from(sorted(COMMAND_PARSERS)))
    argv = list(words)
    for action in COMMAND_PARSERS[words]._actions:
        if action.option_strings:
            if action.nargs == 0 and action.dest in ("help", "version"):
                continue
            times = draw(st.sampled_from([0, 0, 1, 2] if isinstance(action, argparse._AppendAction) else [0, 0, 1]))
            for _ in range(times):
                flag = draw(st.sampled_from(action.option_strings))
                argv += [flag] if action.nargs == 0 else [flag, _value(draw, action)]
        elif action.nargs != 0 and draw(st.integers(0, 9)):  # a positional, left out now and then
            argv.append(_value(draw, action))
    return argv


@settings(FUZZ, max_examples=max(20, EXAMPLES // 5))  # infer and chat load a model: about a second each
@given(argv=command_lines())
def test_every_commands_arguments_end_in_a_result_or_a_message(argv) -> None:
    """Random arguments for every command, run in a scratch folder: a result, or argparse's usage error, or one
    message; never a traceback.  `run` is always a --dry-run; `demo` and `probe` (which train) and `serve` without
    --print (which serves until stopped) are only parsed."""
    CASES["command lines"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "folder").mkdir()
        (project / "recipe.yaml").write_text(recipe_to_yaml(Recipe()))
        (project / "prompts.jsonl").write_text('{"prompt": "reverse\\nab"}\n{"prompt": 1}\n')
        if argv[0] == "run":
            argv = [*argv, "--dry-run"]
        previous, stdin = os.getcwd(), sys.stdin
        os.chdir(project)
        sys.stdin = io.TextIOWrapper(io.BytesIO(b"reverse\\\nab\n\xff\n/reset\n"))  # for chat
        try:
            if argv[0] in ("demo", "probe") or (argv[0] == "serve" and "--print" not in argv):
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    try:
                        build_parser().parse_args(argv)
                        code = 0
                    except SystemExit as exc:
                        code = exc.code
                err = err.getvalue()
            else:
                code, _, err = run_cli(*argv)
        finally:
            os.chdir(previous)
            sys.stdin = stdin
        assert "Traceback" not in err, err
        assert code in (0, 1, 2), f"{argv}: exit code {code}: {err}"  # 1: plan does not fit, a doctor check failed
        REACHED[f"command lines past argparse: {argv[0]}"] += not err.startswith("usage: ")
        REACHED[f"command lines that ran to exit 0: {argv[0]}"] += code == 0
        if code == 2 and not re.search(r"^(error: |usage: )", err, re.M):
            # infer and chat answer what they can and exit 2 for the lines or messages they reported
            assert re.search(r"^(warning: \S+:\d+: |message \d+ is not UTF-8)", err, re.M), err
        elif code == 2:
            start = re.search(r"^(error: |usage: )", err, re.M).start()  # after the placement table, progress bars
            lines = [line for line in err[start:].splitlines() if not line.startswith("warning: ")]
            assert_clean(code, "\n".join(lines))


# -- the real process, for a handful of the worst ---------------------------------------------------------------

SUBPROCESS_CASES = {
    "alias bomb": _anchor_bomb(12, 12).encode(),
    "recursive alias": b"a: &a [*a]\n",
    "deep nesting": b"a: " + b"[" * 3000 + b"]" * 3000 + b"\n",
    "not utf-8": b"name: \xff\xfe\n",
    "python tag": b"model: !!python/object/apply:os.system [touch pwned]\n",
    "duplicate key": b"model:\n  id: a\n  id: b\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_worst_files_in_a_real_process(name, tmp_path, tuner_cli) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_bytes(SUBPROCESS_CASES[name])
    result = tuner_cli("validate", str(path), cwd=tmp_path, timeout=60)
    CASES["subprocess"] += 1
    assert result.returncode == 2, result.stderr
    assert_clean(result.returncode, result.stderr, rf"{re.escape(str(path))}(:\d+)?: ")
    assert not (tmp_path / "pwned").exists()


def test_zz_report_case_count(request, capsys) -> None:
    """Runs last in its group: how many cases the properties above tried."""
    total = sum(CASES.values())
    if not total:
        pytest.skip("run with the fuzz tests to count their cases")
    request.config.cache.set("tuner/fuzz", {"total": total, **CASES, **REACHED})
    with capsys.disabled():
        print(f"\nfuzz cases tried: {total} ({', '.join(f'{k}: {v}' for k, v in (CASES + REACHED).items())})")
    assert total >= 5 * EXAMPLES
