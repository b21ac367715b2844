"""The compatibility check CI runs after the pinned suite: the newest releases of the libraries tuner builds on, as
a user who installs tuner today gets them, under the tests that exercise what they provide.

A user's ``pip install tuner`` resolves the newest transformers, TRL, PEFT, accelerate, datasets and huggingface_hub,
while ``make test`` runs against ``constraints.txt``.  This installs the newest of those the package index offers
into a second environment, ``.venv-compat`` beside the checkout's ``.venv``: a venv whose own site-packages come
first, then ``.venv``'s (a ``.pth`` file), so only the releases that differ (and the dependencies they add) are
installed, in a minute, and ``.venv`` is never written.  Then it runs, under that environment, the demos (SFT, DPO,
GRPO, MoE, tensor parallel), the planner's traces of real transformers classes, the shipped inventories' check and
``tuner serve`` answering the openai client.  A failure names the releases that differ from the pins.

Usage: ``.venv/bin/python .ci/compat.py`` (``.ci/run`` does, after ``make test``); exit 0 when every test passed or
no release differs from the pins, 1 with the failing tests and the releases named otherwise.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = REPO / ".venv-compat"
LIBRARIES = ("transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub")
EXTRAS = {"transformers": "[serving]"}  # tuner's serve extra (pyproject.toml): the server's own dependencies
TESTS = (
    "tests/test_end_to_end.py",  # SFT: the demo trained through accelerate, saved and loaded
    "tests/test_preference_training.py",  # DPO after SFT
    "tests/test_grpo.py",  # GRPO after SFT
    "tests/test_demo_moe.py",  # a mixture of experts, full and LoRA on the fused experts
    "tests/test_tensor_parallel.py",  # two ranks of DeepSpeed's AutoTP
    "tests/test_layer_kinds.py",  # the planner's layer kinds, held to fake-tensor traces of transformers classes
    "tests/test_planner_simulation.py",  # the plan held to a traced training step per architecture
    "tests/test_catalog_models.py",  # the shipped parameter inventories, held to a meta build
    "tests/test_serve.py",  # tuner serve (transformers' server) answering the openai client
    "tests/test_serve_limits.py",
)
PIP_QUIET = ["--quiet", "--disable-pip-version-check"]


def newest_releases() -> dict[str, str]:
    """The newest release of each library the index offers, as pip resolves it for a fresh install (no download)."""
    report = subprocess.run([sys.executable, "-m", "pip", "install", *PIP_QUIET, "--dry-run", "--ignore-installed",
                             "--no-deps", "--report", "-", *LIBRARIES], capture_output=True, text=True, check=True)
    resolved = {item["metadata"]["name"].lower().replace("-", "_"): item["metadata"]["version"]
                for item in json.loads(report.stdout)["install"]}
    return {name: resolved[name.lower()] for name in LIBRARIES}


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def make_environment(upgrades: dict[str, str]) -> Path:
    """``.venv-compat``, built afresh: its own site-packages, then this environment's; ``upgrades`` installed into
    the first with what they need that this environment lacks (pip leaves what lies outside the venv alone)."""
    shutil.rmtree(ENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(ENV)], check=True)
    python = ENV / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    base = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    # addsitedir, not a bare path: the base's own .pth files (the checkout's editable finder) run too; "zz" sorts it
    # after the venv's own .pth files
    (Path(own) / "zz-base-environment.pth").write_text(
        "".join(f"import site; site.addsitedir({path!r})\n" for path in base))
    specs = [f"{name}{EXTRAS.get(name, '')}=={release}" for name, release in upgrades.items()]
    subprocess.run([str(python), "-m", "pip", "install", *PIP_QUIET, "--upgrade-strategy", "only-if-needed", *specs],
                   check=True)
    return python


def main(argv: list[str]) -> int:
    started = time.monotonic()
    newest = newest_releases()
    upgrades = {name: release for name, release in newest.items() if installed(name) != release}
    pinned = ", ".join(f"{name} {installed(name)}" for name in LIBRARIES)
    if not upgrades:
        print(f"compat: the newest releases are the pinned ones ({pinned}): nothing more to check")
        return 0
    named = ", ".join(f"{name} {release} (pinned {installed(name)})" for name, release in upgrades.items())
    print(f"compat: the newest releases that differ from the pins: {named}", flush=True)
    python = make_environment(upgrades)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for name in ("VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(name, None)
    workers = argv[0] if argv else "2"
    # its own --basetemp (and so its own demo model, under tmp/../tuner-home): pytest prunes all but the newest
    # three temporary folders of a user, which other pytest sessions on the machine would do mid-run
    tested = subprocess.run([str(python), "-m", "pytest", "-q", "-n", workers, "--dist", "loadgroup",
                             "-p", "no:cacheprovider", "--durations", "10", "--basetemp", str(ENV / "tmp"), *TESTS], cwd=REPO, env=env)
    minutes = (time.monotonic() - started) / 60
    if tested.returncode != 0:
        print(f"compat: FAILED on {named} ({minutes:.1f} min): the failing tests are listed above; support the "
              "release (or refuse it at start-up with the range tuner supports)", file=sys.stderr)
        return 1
    print(f"compat: passed on {named}, the other libraries as pinned ({len(TESTS)} test files, {minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
