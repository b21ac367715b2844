"""How fast the command line answers: ``tuner --help`` and ``tuner plan`` for an 8B recipe, whole process.

    python benchmarks/cli_startup.py [--repeat N]   # prints the numbers; exit code 1 when over target
    python benchmarks/cli_startup.py --against HEAD~1   # tuner's commands, this tree against that commit, in pairs

Targets (issue 17), on an idle machine: ``tuner --help`` under 0.1 s, ``tuner plan llama3.1/8b-lora`` under
0.15 s. Each command runs N times (default 15) as a fresh ``python -m tuner`` process, interleaved with a bare
interpreter (``python -c pass``) so a busy moment hits all three alike; the median wall time is printed, with the
child's CPU time beside it: on a shared, loaded machine wall time mostly measures the queue for a core.
The children may write bytecode (into a temporary PYTHONPYCACHEPREFIX, not the checkout), as an installed package
has it: with PYTHONDONTWRITEBYTECODE set, every run would compile tuner's modules from source (~0.1 s for plan).

With ``--against REV``, that commit's tree (``git archive``, in a temporary folder) runs each tuner command as
the first of a pair and this checkout as the second, pair after pair, so both see the same moment's load.

Two floors run in the same rotation, so a plan time can be read against them on any machine: the interpreter with
pydantic and one small model (what validating a recipe costs before tuner's own schema), and the interpreter with
every library ``tuner plan`` uses (argparse, YAML, pydantic with one model, rich's console and table) and no tuner.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYDANTIC_MODEL = "from pydantic import BaseModel, Field\nclass A(BaseModel):\n    x: int = Field(1, ge=1)\n"
COMMANDS = {
    "python -c pass": ([sys.executable, "-c", "pass"], None),
    "floor: pydantic, one model": ([sys.executable, "-c", PYDANTIC_MODEL], None),
    "floor: plan's libraries": ([sys.executable, "-c", "import argparse, yaml, rich.console, rich.table\n"
                                 + PYDANTIC_MODEL], None),
    "tuner --help": ([sys.executable, "-m", "tuner", "--help"], 0.10),
    "tuner plan llama3.1/8b-lora": ([sys.executable, "-m", "tuner", "plan", "llama3.1/8b-lora"], 0.15),
    "tuner plan Qwen3-30B-A3B qlora": ([sys.executable, "-m", "tuner", "plan", "--model", "Qwen/Qwen3-30B-A3B",
                                        "--gpus", "1xRTX4090", "--method", "qlora"], 0.15),
}


def timed(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of ``argv``, which must exit with a status in ``ok`` (a plan that does not
    fit exits 1)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(argv, stdout=subprocess.DEVNULL, env=env, cwd=REPO)
    if result.returncode not in ok:
        raise subprocess.CalledProcessError(result.returncode, argv)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _ok(name: str) -> tuple[int, ...]:
    """A plan that does not fit (Qwen3-30B-A3B in 4 bits on one 24 GB card) exits 1, which is an answer too."""
    return (0, 1) if name.startswith("tuner plan") else (0,)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--against", metavar="REV", help="a commit to run each tuner command against, in pairs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as pycache:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=pycache)
        if args.against is None:
            return measure(args.repeat, env)
        base = Path(pycache) / "base"
        base.mkdir()
        archive = subprocess.run(["git", "archive", args.against], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        return measure_pairs(args.repeat, env, {**env, "PYTHONPATH": str(base)}, args.against)


def measure_pairs(repeat: int, env: dict[str, str], base_env: dict[str, str], base: str) -> int:
    """Each tuner command: ``base``'s tree, then this checkout's, ``repeat`` pairs in a row per round."""
    names = [name for name in COMMANDS if name.startswith("tuner")]
    for name in names:  # warm the file cache and write both trees' .pyc files
        timed(COMMANDS[name][0], base_env, _ok(name))
        timed(COMMANDS[name][0], env, _ok(name))
    load_before = os.getloadavg()
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(repeat):
        for name in names:
            for tree, tree_env in ((base, base_env), ("this tree", env)):
                runs.setdefault((name, tree), []).append(timed(COMMANDS[name][0], tree_env, _ok(name)))
    load_after = os.getloadavg()
    for name in names:
        for tree in (base, "this tree"):
            wall = [w for w, _ in runs[name, tree]]
            cpu = statistics.median(c for _, c in runs[name, tree])
            print(f"{name:<32} {tree:<10} median {statistics.median(wall):.3f} s wall (min {min(wall):.3f}), "
                  f"{cpu:.3f} s CPU")
    print(f"{repeat} pairs each; load average {' '.join(f'{x:.2f}' for x in load_before)} before, "
          f"{' '.join(f'{x:.2f}' for x in load_after)} after, on {os.cpu_count()} cores")
    return 0


def measure(repeat: int, env: dict[str, str]) -> int:
    for name, (argv, _) in COMMANDS.items():  # warm the file cache and write the .pyc files
        timed(argv, env, _ok(name))
    load_before = os.getloadavg()
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for _ in range(repeat):
        for name, (argv, _) in COMMANDS.items():
            runs[name].append(timed(argv, env, _ok(name)))
    load_after = os.getloadavg()
    ok = True
    for name, (_, target) in COMMANDS.items():
        wall = statistics.median(w for w, _ in runs[name])
        cpu = statistics.median(c for _, c in runs[name])
        verdict = ""
        if target is not None:
            verdict = f"target {target:.2f} s: {'met' if wall < target else 'NOT met'}"
            ok = ok and wall < target
        print(f"{name:<30} median {wall:.3f} s wall (min {min(w for w, _ in runs[name]):.3f}), "
              f"{cpu:.3f} s CPU   {verdict}")
    print(f"{repeat} runs each, interleaved; load average {' '.join(f'{x:.2f}' for x in load_before)} before, "
          f"{' '.join(f'{x:.2f}' for x in load_after)} after, on {os.cpu_count()} cores")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
