"""A hostile campaign over the inputs whose code tuner runs or whose bytes it trusts (issue 48, items 3, 5, 6):
generated reward functions and reward file locations, harness task folders, paths, damaged checkpoints and model
folders that ship code.  Each case is judged by an oracle that does not share tuner's code:

- unannounced code execution: a reward file validate/plan did not name, a ``!function`` module the harness's own YAML
  loader imported that ``tuner eval`` did not list, a model's ``auto_map`` tuner did not see, code run by a check;
- hang past a stated limit: a reward call that returned later than ``reward_time_limit_s`` + 2 s;
- traceback: any exception other than tuner's own refusals escaping a command or a check, or a checkpoint
  passed as whole that transformers' resume cannot read;
- data loss: a byte of a file tuner did not write changed, or a folder named ``~``/``$VAR``/with a hidden character.

Run: python -m benchmarks.hostile_inputs --seed 0 --cases 1000   (results in benchmarks/results/)
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import io
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CLASSES = ("rewards", "reward files", "task files", "paths", "checkpoints", "model code", "disk full")
HIDDEN = [*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)), *map(chr, range(0x200B, 0x2010)),
          "\u2060", "\ufeff"]
LIMIT_S = 0.3  # the reward time limit the campaign sets (the default is 120 s)


class Tally:
    def __init__(self):
        self.cases, self.findings = Counter(), {kind: [] for kind in
                                               ("unannounced code", "hang", "traceback", "data loss")}
        self.outcomes = Counter()
        self.seconds = Counter()

    def case(self, klass: str, outcome: str) -> None:
        self.cases[klass] += 1
        self.outcomes[(klass, outcome)] += 1

    def finding(self, kind: str, klass: str, what: str) -> None:
        self.findings[kind].append(f"{klass}: {what}"[:300])


@contextlib.contextmanager
def quiet():
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        yield err


# -- rewards: what a reward function returns or does ----------------------------------------------------------------

def reward_behaviours(rng: random.Random):
    n = 3
    choices = [
        ("finite", lambda: [rng.uniform(-5, 5) for _ in range(n)], True),
        ("none", lambda: [None] * n, True),
        ("ints", lambda: [rng.randint(-3, 3) for _ in range(n)], True),
        ("nan", lambda: [float("nan")] + [0.0] * (n - 1), False),
        ("inf", lambda: [0.0, float("inf"), 0.0], False),
        ("-inf", lambda: [0.0, 0.0, float("-inf")], False),
        ("short", lambda: [0.0] * rng.randint(0, n - 1), False),
        ("long", lambda: [0.0] * rng.randint(n + 1, 9), False),
        ("text", lambda: ["1.0"] * n, False),
        ("nested", lambda: [[1.0]] * n, False),
        ("dict", lambda: {"a": 1}, False),
        ("scalar", lambda: 1.0, False),
        ("raises", lambda: 1 / 0, False),
        ("exits", lambda: (_ for _ in ()).throw(SystemExit(3)), False),
        ("hangs", lambda: threading.Event().wait(), False),
        ("sleeps", lambda: time.sleep(rng.uniform(1, 3)), False),
        ("slow but within", lambda: (time.sleep(LIMIT_S / 3), [0.0] * n)[1], True),
    ]
    return rng.choice(choices)


def reward_case(rng: random.Random, tally: Tally) -> None:
    from tuner.train.rewards import CheckedReward, RewardError

    name, behaviour, good = reward_behaviours(rng)
    checked = CheckedReward(lambda **_: behaviour(), "hostile", 0, "prompts.jsonl", True, LIMIT_S)
    start = time.monotonic()
    try:
        checked(prompts=["a", "b", "c"], completions=["x", "y", "z"], completion_ids=[[1], [2], [3]],
                **{"__tuner_row": [1, 2, 3]})
        outcome = "scored"
    except RewardError as exc:
        outcome = "refused"
        if "'hostile'" not in str(exc):
            tally.finding("traceback", "rewards", f"{name}: a refusal not naming the reward: {exc}")
    except BaseException as exc:  # SystemExit too: a reward must not end the rank in its own words
        outcome = "escaped"
        tally.finding("traceback", "rewards", f"{name}: {type(exc).__name__}: {exc}")
    took = time.monotonic() - start
    if took > LIMIT_S * (1 + 3) + 2:  # the call, and at most 3 single-completion calls on the failure path
        tally.finding("hang", "rewards", f"{name}: {took:.1f} s against a limit of {LIMIT_S} s per call")
    if (outcome == "scored") != good and outcome != "escaped":
        tally.finding("traceback", "rewards", f"{name}: {outcome}, expected {'scored' if good else 'refused'}")
    tally.case("rewards", f"{name}: {outcome}")


def reward_file_case(rng: random.Random, tally: Tally, root: Path) -> None:
    """A reward file beside, below, above (../) or absolute to the recipe: validate names it, and runs nothing."""
    from tuner.recipe.io import RecipeError, load_recipe
    from tuner.recipe.warnings import recipe_warnings

    case = Path(tempfile.mkdtemp(dir=root))
    recipe_dir = case / "a" / "b"
    recipe_dir.mkdir(parents=True)
    up = rng.randint(0, 2)
    down = rng.sample(["x", "y z", "ünï", "-dash"], rng.randint(0, 2))
    code_dir = recipe_dir.joinpath(*[".."] * up, *down)
    code_dir.mkdir(parents=True, exist_ok=True)
    marker = case / "RAN"
    (code_dir / "score.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef score(**_):\n    return []\n")
    spec = str((code_dir / "score.py").resolve()) if rng.random() < 0.3 else str(Path(*[".."] * up, *down, "score.py"))
    (recipe_dir / "recipe.yaml").write_text(
        "objective:\n  kind: grpo\n  grpo:\n    num_generations: 2\n    rewards:\n"
        f"      - {{kind: function, function: {json.dumps(spec + ':score')}}}\ntraining:\n  micro_batch_size: 2\n")
    try:
        warnings = recipe_warnings(load_recipe(recipe_dir / "recipe.yaml"))
        outcome = "named"
        if not any(str((code_dir / "score.py").resolve()) in warning for warning in warnings):
            tally.finding("unannounced code", "reward files", f"{spec}: not named by validate's warnings")
            outcome = "unnamed"
    except RecipeError:
        outcome = "refused"
    except Exception as exc:
        outcome = "escaped"
        tally.finding("traceback", "reward files", f"{spec}: {type(exc).__name__}: {exc}")
    if marker.exists():
        tally.finding("unannounced code", "reward files", f"{spec}: validate ran the reward file")
    tally.case("reward files", outcome)


# -- task files: where a !function can hide ---------------------------------------------------------------------------

def task_case(rng: random.Random, tally: Tally, root: Path) -> None:
    """A folder of task YAMLs with !function tags placed at random (and decoys); the harness's own YAML loader is the
    oracle of what runs: every module it imports must be in tuner eval's list."""
    from lm_eval.tasks._yaml_loader import load_yaml

    from tuner.evaluate.tasks import task_code

    case = Path(tempfile.mkdtemp(dir=root))
    folder = case / "tasks"
    folder.mkdir()
    files: dict[Path, list[str]] = {folder / "main.yaml": ["task: main"]}
    modules = []
    for index in range(rng.randint(0, 4)):
        module = f"mod{index}"
        (folder / f"{module}.py").write_text(f"open(__file__ + '.ran', 'w').write('ran')\ndef fn(*a, **k):\n    return a\n")
        place = rng.choice(["top", "nested", "list", "yml", "directive", "included", "flow"])
        if place == "top":
            files[folder / "main.yaml"].append(f"f{index}: !function {module}.fn")
        elif place == "nested":
            files[folder / "main.yaml"].append(f"n{index}:\n  inner:\n    fn: !function {module}.fn")
        elif place == "list":
            files[folder / "main.yaml"].append(f"l{index}:\n  - plain\n  - !function {module}.fn")
        elif place == "flow":
            files[folder / "main.yaml"].append(f"w{index}: {{a: 1, b: !function {module}.fn}}")
        elif place == "yml":
            files[folder / f"other{index}.yml"] = [f"task: o{index}", f"fn: !function {module}.fn"]
        elif place == "directive":
            files[folder / f"dir{index}.yaml"] = ["%TAG !e! !", "---", f"task: d{index}", f"fn: !e!function {module}.fn"]
        else:  # a file outside the folder, included by ../ ; its module beside it
            shutil.move(folder / f"{module}.py", case / f"{module}.py")
            (case / f"shared{index}.yaml").write_text(f"process_docs: !function {module}.fn\n")
            files.setdefault(folder / "inc.yaml", ["task: inc", "include:"]).append(f"  - ../shared{index}.yaml")
        modules.append(module)
    for _ in range(rng.randint(0, 2)):
        files[folder / "main.yaml"].append(rng.choice([f"note: {json.dumps('!function mod0.fn')}",
                                                       "# doc_to_text: !function mod0.fn", "text: '!function x.y'"]))
    for path, lines in files.items():
        path.write_text("\n".join(lines) + "\n")
    try:
        listed = task_code(folder)
    except Exception as exc:
        tally.finding("traceback", "task files", f"task_code: {type(exc).__name__}: {exc}")
        listed = []
    if any(case.rglob("*.ran")):
        tally.finding("unannounced code", "task files", "task_code ran a module")
    for path in files:  # now the harness's loader, importing what the tags name
        try:
            load_yaml(path, resolve_func=True, recursive=True)
        except Exception:
            pass  # a file the harness refuses runs nothing more
    ran = sorted(p.name.removesuffix(".py.ran") for p in case.rglob("*.py.ran"))
    unlisted = [module for module in ran if not any(f"!function {module}.fn" in entry for entry in listed)]
    if unlisted:
        tally.finding("unannounced code", "task files", f"the harness ran {unlisted}, not listed: {listed}")
    tally.case("task files", f"{len(listed)} listed, {len(ran)} ran")


# -- paths ------------------------------------------------------------------------------------------------------------

def hostile_path(rng: random.Random) -> tuple[str, str]:
    part = lambda: "".join(rng.choice("abc._- ü") for _ in range(rng.randint(1, 6))).strip() or "p"
    kind = rng.choice(["plain", "hidden", "variable", "tilde", "tilde user", "tilde inside", "control", "relative up"])
    if kind == "plain":
        return kind, f"runs/{part()}"
    if kind == "hidden":
        text = f"runs/{part()}"
        at = rng.randint(0, len(text))
        return kind, text[:at] + rng.choice(HIDDEN) + text[at:]
    if kind == "variable":
        return kind, rng.choice(["$HOME", "${HOME}/x", f"runs/$USER/{part()}", f"$TMPDIR{part()}"])
    if kind == "tilde":
        return kind, f"~/{part()}"
    if kind == "tilde user":
        return kind, f"~no_such_user_{rng.randint(0, 999)}/{part()}"
    if kind == "tilde inside":
        return kind, f"runs/~/{part()}"
    if kind == "control":
        return kind, f"runs/{part()}" + rng.choice(["\n", "\t", "\x1b[2J", "\x00"]) + "x"
    return kind, f"../{part()}"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def path_case(rng: random.Random, tally: Tally, root: Path) -> None:
    """A generated path as -o, --set output.dir or --model: exit 0 or 2, nothing of the user's changed, no folder
    named as the shell would have expanded it or holding a hidden character."""
    from tuner.cli import main

    case = Path(tempfile.mkdtemp(dir=root))
    home, work = case / "home", case / "work"
    home.mkdir()
    work.mkdir()
    (home / "mine.txt").write_text("the user's")
    (work / "notes.md").write_text("the user's too")
    before = {**{f"home/{k}": v for k, v in snapshot(home).items()}, **{f"work/{k}": v for k, v in snapshot(work).items()}}
    kind, path = hostile_path(rng)
    how = rng.choice(["-o", "output.dir", "--model"])
    argv = (["render", "demo", "-o", path] if how == "-o" else ["render", "demo", "--set", f"output.dir={json.dumps(path)}"]
            if how == "output.dir" else ["infer", "--model", path, "--prompt", "hi"])
    old_home, old_cwd = os.environ.get("HOME"), os.getcwd()
    os.environ["HOME"] = str(home)
    os.chdir(work)
    try:
        with quiet() as err:
            code = main(argv)
        told = err.getvalue()
    except SystemExit as exc:
        code, told = exc.code, ""
    except Exception as exc:
        code, told = None, f"{type(exc).__name__}: {exc}"
        tally.finding("traceback", "paths", f"{how} {path!r}: {told}")
    finally:
        os.chdir(old_cwd)
        os.environ["HOME"] = old_home or ""
    after = {**{f"home/{k}": v for k, v in snapshot(home).items()}, **{f"work/{k}": v for k, v in snapshot(work).items()}}
    changed = [name for name, data in before.items() if after.get(name) != data]
    if changed:
        tally.finding("data loss", "paths", f"{how} {path!r}: changed {changed}")
    odd = [str(p) for p in case.rglob("*") if p.name.startswith(("~", "$")) or "$" in p.name
           or any(ch in p.name for ch in HIDDEN)]
    if odd:
        tally.finding("data loss", "paths", f"{how} {path!r}: made {odd}")
    if code not in (0, 1, 2) or (kind in ("hidden", "variable", "tilde user", "tilde inside", "control") and code == 0):
        tally.finding("traceback", "paths", f"{how} {path!r}: exit {code}: {told[-200:]}")
    if any(ch in told for ch in HIDDEN):
        tally.finding("data loss", "paths", f"{how} {path!r}: a hidden character printed raw")
    tally.case("paths", f"{kind}: exit {code}")


# -- damaged checkpoints ----------------------------------------------------------------------------------------------

def real_checkpoint(root: Path) -> Path:
    """Two checkpoints of the demo model written by a real Trainer with tuner's checkpoint callback."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from tuner.loading.model import resolve_model_path
    from tuner.recipe.io import load_recipe, recipe_to_yaml
    from tuner.recipe.registry import builtin_path
    from tuner.train.checkpoints import CheckpointInfoCallback

    out = root / "checkpoints"
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin:demo"), dtype=torch.float32)
    samples = [{"input_ids": [1, 5, 6, 7, 2], "labels": [1, 5, 6, 7, 2]}] * 4
    args = TrainingArguments(str(out), max_steps=2, save_steps=1, per_device_train_batch_size=2, report_to=[],
                             use_cpu=True, logging_steps=1, save_total_limit=None, disable_tqdm=True)
    recipe = load_recipe(builtin_path("demo"))
    with quiet():
        Trainer(model=model, args=args, train_dataset=samples,
                callbacks=[CheckpointInfoCallback(recipe, recipe_to_yaml(recipe))]).train()
    return out


STATE_VALUES = [None, True, -1, 2.5, float("nan"), "2", [], [1], {}, {"a": 1}, [{"loss": 1}], 10 ** 30]


def resume_reads(state) -> bool:
    """The oracle: what transformers' resume does with trainer_state.json goes through."""
    from transformers import TrainerState

    try:
        loaded = TrainerState(**state)
        int(loaded.global_step // 3), loaded.global_step % 3
        if loaded.best_model_checkpoint is not None:
            os.path.isdir(loaded.best_model_checkpoint)
        for value in loaded.stateful_callbacks.values():
            for one in value if isinstance(value, list) else [value]:
                one.get("args", {}), one.get("attributes", {})
        loaded.log_history.append({"loss": 0.5})
    except Exception:
        return False
    return "global_step" in state


def checkpoint_case(rng: random.Random, tally: Tally, root: Path, source: Path) -> None:
    from tuner.rundir.checkpoints import incomplete_reason

    case = Path(tempfile.mkdtemp(dir=root))
    checkpoint = case / "checkpoint-2"
    shutil.copytree(source / "checkpoint-2", checkpoint)
    state_path = checkpoint / "trainer_state.json"
    damage = rng.choice(["state field", "state key", "state no step", "state list", "truncate", "flip json",
                         "remove", "none"])
    if damage.startswith("state"):
        state = json.loads(state_path.read_text())
        if damage == "state field":
            state[rng.choice(sorted(state))] = rng.choice(STATE_VALUES)
        elif damage == "state key":
            state[rng.choice(["bogus", "GLOBAL_STEP", "step", "épisode"])] = 1
        elif damage == "state no step":
            del state["global_step"]
        else:
            state = [state]
        text = json.dumps(state)
        size = state_path.stat().st_size
        state_path.write_text(text + " " * max(0, size - len(text)))  # at its recorded size where it fits
    elif damage == "truncate":
        victim = rng.choice([p for p in checkpoint.iterdir() if p.is_file()])
        data = victim.read_bytes()
        victim.write_bytes(data[: rng.randint(0, max(len(data) - 1, 0))])
    elif damage == "flip json":
        data = bytearray(state_path.read_bytes())
        at = rng.randrange(len(data))
        data[at] = rng.choice(b'{}[]":,0x ')
        state_path.write_bytes(bytes(data))
    elif damage == "remove":
        rng.choice([p for p in checkpoint.iterdir() if p.is_file()]).unlink()
    try:
        problem = incomplete_reason(checkpoint, verify=rng.random() < 0.5)  # what resume judges by
    except Exception as exc:
        tally.finding("traceback", "checkpoints", f"{damage}: {type(exc).__name__}: {exc}")
        tally.case("checkpoints", f"{damage}: escaped")
        return
    if problem is None and state_path.is_file():
        try:
            state = json.loads(state_path.read_text())
        except ValueError:
            state = None
        if not isinstance(state, dict) or not resume_reads(state):
            tally.finding("traceback", "checkpoints", f"{damage}: passed as whole, resume cannot read its state")
    tally.case("checkpoints", f"{damage}: {'refused' if problem else 'whole'}")


# -- model folders that ship code -------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def big_vocabulary() -> str:
    return json.dumps({str(i): {"content": f"<extra_token_{i}>", "special": False} for i in range(150_000)})


def model_code_case(rng: random.Random, tally: Tally, root: Path) -> None:
    """A model folder whose config.json or tokenizer_config.json (up to a few MiB past the 4 MiB limit) names code:
    tuner's check must see it; json.loads of the whole file is the oracle."""
    from tuner.catalog import models

    case = Path(tempfile.mkdtemp(dir=root))
    where = rng.choice(["config.json", "tokenizer_config.json"])
    big = where == "tokenizer_config.json" and rng.random() < 0.4
    config = {"model_type": "llama"}
    other = {"note": rng.choice(['"auto_map": {"A": "decoy.Code"}', "auto_map", "plain"])}
    present = rng.random() < 0.7
    target = config if where == "config.json" else other
    if present:
        node = target
        for name in rng.sample(["text_config", "vision_config", "sub"], rng.randint(0, 2)):
            node = node.setdefault(name, {})
        node["auto_map"] = {"AutoModelForCausalLM": f"modeling_{rng.randint(0, 99)}.Model"}
    (case / "config.json").write_text(json.dumps(config))
    text = json.dumps(other)
    if big:  # the vocabulary first: a tokenizer_config.json past the 4 MiB read limit, auto_map after it
        text = '{"added_tokens_decoder": ' + big_vocabulary() + ", " + text[1:]
    if present and where == "tokenizer_config.json" and rng.random() < 0.5:
        spelled = "".join(f"\\u{ord(ch):04x}" if rng.random() < 0.5 else ch for ch in "auto_map")
        text = text.replace('"auto_map": ', f'"{spelled}"{" " * rng.randint(0, 5000)}:\n ', 1)
    (case / "tokenizer_config.json").write_text(text)
    expected = set().union(*(models.code_refs(json.loads((case / name).read_text()))
                             for name in ("config.json", "tokenizer_config.json")))
    try:
        seen = set(models.custom_code(str(case)))
    except Exception as exc:
        tally.finding("traceback", "model code", f"{type(exc).__name__}: {exc}")
        seen = set()
    if expected - seen:
        tally.finding("unannounced code", "model code", f"{where} ({'big' if big else 'small'}): missed {expected - seen}")
    tally.case("model code", f"{where}{' >4 MiB' if big else ''}: {'code' if expected else 'none'}")


# -- a full disk under the log thread ---------------------------------------------------------------------------------

class FullDisk(io.TextIOBase):
    def __init__(self, room: int):
        self.room, self.used = room, 0

    def write(self, text: str) -> int:
        if self.used + len(text) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.used += len(text)
        return len(text)


def disk_case(rng: random.Random, tally: Tally, root: Path) -> None:
    from tuner.launch.runner import Launch

    case = Path(tempfile.mkdtemp(dir=root))
    gate = case / "go"
    lines = rng.randint(1, 300)
    script = (f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)\n"
              f"for i in range({lines}):\n    print('line', i)\n")
    raised = []
    previous, threading.excepthook = threading.excepthook, raised.append
    try:
        launch = Launch([sys.executable, "-c", script], case)
        launch._log.close()
        launch._log = FullDisk(room=rng.randint(0, 2000))
        gate.touch()
        code = launch.finish()
    finally:
        threading.excepthook = previous
    if raised or code != 0 or launch.tail[-1] != f"line {lines - 1}":
        tally.finding("traceback", "disk full", f"{lines} lines: thread raised {raised}, exit {code}")
    if launch.log_problem and "free)" not in launch.log_problem:
        tally.finding("traceback", "disk full", f"the message names no free space: {launch.log_problem}")
    tally.case("disk full", "log given up" if launch.log_problem else "all logged")


WEIGHTS = {"rewards": 0.25, "reward files": 0.1, "task files": 0.15, "paths": 0.25, "checkpoints": 0.12,
           "model code": 0.1, "disk full": 0.03}


def run_case(klass: str, rng: random.Random, tally: Tally, root: Path, source: Path) -> None:
    if klass == "rewards":
        reward_case(rng, tally)
    elif klass == "reward files":
        reward_file_case(rng, tally, root)
    elif klass == "task files":
        task_case(rng, tally, root)
    elif klass == "paths":
        path_case(rng, tally, root)
    elif klass == "checkpoints":
        checkpoint_case(rng, tally, root, source)
    elif klass == "model code":
        model_code_case(rng, tally, root)
    else:
        disk_case(rng, tally, root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=1000)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    tally = Tally()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source = real_checkpoint(root)
        plan = [klass for klass in CLASSES for _ in range(max(1, round(WEIGHTS[klass] * args.cases)))]
        rng.shuffle(plan)
        for klass in plan:
            began = time.monotonic()
            run_case(klass, rng, tally, root, source)
            tally.seconds[klass] += time.monotonic() - began
    total = sum(tally.cases.values())
    print(f"hostile inputs: seed {args.seed}, {total} cases in {time.monotonic() - start:.0f} s")
    for klass in CLASSES:
        print(f"  {klass}: {tally.cases[klass]} cases, {tally.seconds[klass]:.1f} s")
        for (k, outcome), count in sorted(tally.outcomes.items()):
            if k == klass:
                print(f"    {outcome}: {count}")
    for kind, found in tally.findings.items():
        print(f"{kind}: {len(found)}")
        for line in found[:20]:
            print(f"  - {line}")
    return 1 if any(tally.findings.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
