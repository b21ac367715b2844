"""What planning an uncatalogued architecture costs: the first ``tuner plan --model DIR`` (transformers builds the
model on the meta device and the inventory is cached) against the second (read from the cache) and a catalog plan.

    python benchmarks/first_plan.py [--repeat N]   # prints the numbers

The model is a local folder holding only the config.json of transformers' own ``Qwen3MoeConfig`` defaults with
seven layers, so no shipped inventory matches it and nothing comes from a hub. Every "first" run gets an empty
``$TUNER_HOME``; every "cached" run reuses one that a first run filled. Full and LoRA plans both run: LoRA's first
plan also builds the PEFT model once to count its targets. Whole processes, interleaved, median wall time with the
child's CPU time beside it (on a loaded machine the wall column mostly measures the queue for a core).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.cli_startup import REPO, timed

LAYERS = 7  # any count no shipped inventory has: the config must be new to tuner


def model_folder(root: Path) -> Path:
    """A folder with only config.json: Qwen3-MoE's defaults, LAYERS layers."""
    from transformers import Qwen3MoeConfig

    folder = root / "qwen3-moe-7-layers"
    folder.mkdir()
    config = Qwen3MoeConfig(num_hidden_layers=LAYERS).to_dict()
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        folder = model_folder(root)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=str(root / "pycache"))
        plan = [sys.executable, "-m", "tuner", "plan", "--model", str(folder), "--gpus", "1xH100-80GB"]
        commands = {
            "catalog: plan llama3.1/8b-lora": ([sys.executable, "-m", "tuner", "plan", "llama3.1/8b-lora"], "warm"),
            "uncatalogued full, first": (plan + ["--method", "full"], "cold"),
            "uncatalogued full, cached": (plan + ["--method", "full"], "warm"),
            "uncatalogued LoRA, first": (plan + ["--method", "lora"], "cold"),
            "uncatalogued LoRA, cached": (plan + ["--method", "lora"], "warm"),
        }
        warm_home = root / "warm-home"
        for argv, _ in commands.values():  # .pyc files written, the warm home filled (full and LoRA)
            timed(argv, {**env, "TUNER_HOME": str(warm_home)})
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        load_before = os.getloadavg()
        for _ in range(repeat):
            for name, (argv, home) in commands.items():
                cold_home = root / "cold-home"
                shutil.rmtree(cold_home, ignore_errors=True)
                runs[name].append(timed(argv, {**env, "TUNER_HOME": str(cold_home if home == "cold" else warm_home)}))
        load_after = os.getloadavg()
    for name, measured in runs.items():
        print(f"{name:<32} median {statistics.median(w for w, _ in measured):.3f} s wall "
              f"(min {min(w for w, _ in measured):.3f}), {statistics.median(c for _, c in measured):.3f} s CPU")
    print(f"{repeat} runs each, interleaved; load average {' '.join(f'{x:.2f}' for x in load_before)} before, "
          f"{' '.join(f'{x:.2f}' for x in load_after)} after, on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
