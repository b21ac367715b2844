"""Where a demo's time goes: ``tuner demo --recipe R`` from this checkout and from another commit, side by side.

    python benchmarks/demo_speed.py [--recipe demo-grpo] [--against REV]

Both demos start together (each in its own temporary folder, sharing one ``$TUNER_HOME`` whose demo model is built
first), so a busy machine slows both alike; each line of their output is stamped with the seconds since its start,
which shows where an older tree's time went (it prints no phases), and this tree's last lines name each phase's time.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stamp(process: subprocess.Popen, start: float, lines: list[str]) -> None:
    """Each line of the demo's output as it comes, with the seconds since both started (read in a thread: a pipe
    left unread would stop the other demo)."""
    for line in process.stdout:
        lines.append(f"[{time.monotonic() - start:7.1f}] {line.rstrip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="demo-grpo")
    parser.add_argument("--against", metavar="REV", help="a commit to run the same demo from, at the same time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        env = {key: value for key, value in os.environ.items()
               if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}  # libraries' bytecode as installed
        env.update(TUNER_HOME=str(root / "home"), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
        trees = {"this tree": REPO}
        if args.against:
            base = root / "base"
            base.mkdir()
            archive = subprocess.run(["git", "archive", args.against], cwd=REPO, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            trees = {args.against: base, **trees}
        subprocess.run([sys.executable, "-c", "from tuner.loading.demo_model import builtin_model_path; "
                        "builtin_model_path('builtin:demo')"], env={**env, "PYTHONPATH": str(REPO)}, check=True)
        start, running, readers = time.monotonic(), {}, []
        for name, tree in trees.items():
            folder = root / name.replace(" ", "-")
            folder.mkdir()
            running[name] = subprocess.Popen([sys.executable, "-m", "tuner", "demo", "--recipe", args.recipe, "-o",
                                              "runs/demo-speed"], cwd=folder, env={**env, "PYTHONPATH": str(tree)},
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            lines: list[str] = []
            readers.append((name, lines, threading.Thread(target=stamp, args=(running[name], start, lines))))
            readers[-1][2].start()
        load = os.getloadavg()
        for name, lines, reader in readers:
            reader.join()
            process = running[name]
            print(f"== {name}: exit {process.wait()}\n" + "\n".join(lines))
        print(f"load average {' '.join(f'{x:.2f}' for x in load)} at the start, "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end, on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
