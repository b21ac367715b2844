"""Hostile folders: does any tuner command replace, delete or write through a byte tuner did not write?

Each case builds a folder (nothing there, an empty folder, a run directory tuner rendered, an older tuner's run with
no manifest, a run holding only its probe, a presets folder, a merged model's folder, an older one's), then changes it as a user might (their bytes under one of
tuner's names or their own, an edit of a file tuner wrote, a symbolic link to a file or folder outside, a nested
folder, a damaged, foreign or older manifest), then runs one command on it with or without ``--force``: ``tuner
render -o``, ``tuner run --dry-run``, ``tuner run --resume --dry-run`` (through the command line's ``main``, as typed),
``tuner presets cp``, ``tuner adopt``, and merge's and export's destination checks followed by the whole-folder
replacement they make when the check passes.  Every entry (a link not followed) of the folder and of a folder outside it that links point at is
snapshotted before and after; a change to anything the folder's manifest did not prove tuner's before the command is
data loss.  An exception that escapes the command line is a traceback.

Run: python -m benchmarks.hostile_folders --seed 1 --cases 600   (results in benchmarks/results/hostile-folders_*.md)
tests/test_ownership.py generates the same cases with hypothesis.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner.rundir.layout import (  # noqa: E402
    CHECKPOINTS_DIR,
    EVENTS_FILE,
    FINAL_DIR,
    LOG_FILE,
    MANIFEST,
    MODEL_SNAPSHOT,
    PREVIOUS_RUNS_DIR,
    PROBE_DIR,
    RENDERED_FILES,
)

BASES = ("absent", "empty", "run", "older run", "probe", "presets", "merged", "older merged")
# names tuner writes somewhere (rendered files, run outputs, presets, a merged model's) and names it never writes
TUNER_NAMES = (*RENDERED_FILES, MANIFEST, EVENTS_FILE, LOG_FILE, MODEL_SNAPSHOT, CHECKPOINTS_DIR, FINAL_DIR,
               PREVIOUS_RUNS_DIR, PROBE_DIR, "slurm-12.log", ".recipe.lock.yaml.ab12.tmp", "ddp.yaml", "zero2.json",
               "model.safetensors", "config.json")
FOREIGN_NAMES = ("notes.md", "train.py", "data.csv", "thesis.tex")
CHANGES = ("bytes", "edit", "link", "folder", "manifest")
LINK_TARGETS = ("file", "folder", "dangling")
MANIFESTS = ("damaged", "older list", "not an object", "foreign digests")
COMMANDS = ("render", "run --dry-run", "run --resume --dry-run", "presets cp", "merge", "export", "adopt")
RESULTS = REPO / "benchmarks" / "results"


def random_case(rng: random.Random) -> dict:
    """One case: a base folder, up to four changes, a command and whether ``--force`` is given."""
    changes = []
    for _ in range(rng.randint(0, 4)):
        kind = rng.choice(CHANGES)
        name = rng.choice(TUNER_NAMES + FOREIGN_NAMES)
        payload = {"bytes": lambda: rng.choice([b"mine\n", b"", b"#!/bin/sh\nrm -rf ~\n", os.urandom(64)]),
                   "edit": lambda: rng.choice([b"\n# my change\n", b"x"]),
                   "link": lambda: rng.choice(LINK_TARGETS), "folder": lambda: b"inside\n",
                   "manifest": lambda: rng.choice(MANIFESTS)}[kind]()
        changes.append((kind, name, payload))
    return {"base": rng.choice(BASES), "changes": changes, "command": rng.choice(COMMANDS), "force": rng.random() < 0.5}


def _demo(folder: Path):
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_path

    return load_recipe(builtin_path("demo"), [f"output.dir={folder}"])


def build(case: dict, folder: Path, outside: Path) -> None:
    """The case's folder, as its base leaves it and its changes make it."""
    from tuner.render.run_directory import write_run_directory
    from tuner.rundir.manifest import record_files

    base = case["base"]
    if base != "absent":
        folder.mkdir(parents=True)
    if base in ("run", "older run"):
        write_run_directory(_demo(folder), force=True)
        (folder / EVENTS_FILE).write_text('{"event": "started"}\n')
        if base == "older run":
            (folder / MANIFEST).unlink()
    elif base == "presets":
        from tuner.cli import main

        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["presets", "cp", str(folder)]) == 0
    elif base == "probe":  # a run directory holding only the probe tuner ran for it, as the probe left it
        from tuner.launch.probe import probe_recipe
        from tuner.rundir.layout import PROBE_REPORT, PROBE_REQUEST
        from tuner.rundir.manifest import amend

        probe = write_run_directory(probe_recipe(_demo(folder)))
        for name in (PROBE_REQUEST, PROBE_REPORT):
            (probe / name).write_text("{}\n")
        amend(probe, written=[PROBE_REQUEST, PROBE_REPORT])
    elif base in ("merged", "older merged"):
        import json

        (folder / "config.json").write_text('{"model_type": "llama"}\n')
        (folder / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}      ")
        record_files(folder, ["config.json", "model.safetensors"], "tuner merge")
        if base == "older merged":  # an older tuner's list of names
            (folder / MANIFEST).write_text(json.dumps({"written_by": "tuner merge",
                                                       "files": ["config.json", "model.safetensors"]}))
    for kind, name, payload in case["changes"]:
        _change(folder, outside, kind, name, payload)


def _change(folder: Path, outside: Path, kind: str, name: str, payload) -> None:
    path = folder / name
    if kind == "edit":
        if path.is_file() and not path.is_symlink():
            with open(path, "ab") as stream:
                stream.write(payload)
        return
    folder.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(path):
        return  # one change per name: what is there stays as the earlier change left it
    if kind == "bytes":
        path.write_bytes(payload)
    elif kind == "link":
        path.symlink_to({"file": outside / "target.txt", "folder": outside / "dir", "dangling": outside / "none"}[payload])
    elif kind == "folder":
        path.mkdir()
        (path / "inner.txt").write_bytes(payload)
    else:
        import json

        path = folder / MANIFEST
        if os.path.lexists(path) and not path.is_file():
            return
        text = {"damaged": '{"files": {"launch.sh": ', "older list": json.dumps({"files": sorted(RENDERED_FILES)}),
                "not an object": "[1, 2]",
                "foreign digests": json.dumps({"files": {n: {"size": 5, "sha256": "0" * 64} for n in (name, *FOREIGN_NAMES)
                                                         if "/" not in n and n != MANIFEST}})}[payload]
        path.unlink(missing_ok=True)
        path.write_text(text)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``, links not followed: a file's bytes, a link's target, a folder."""
    entries = {}
    if not os.path.lexists(root):
        return entries
    for directory, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                entries[relative] = ("link", os.readlink(path))
            elif path.is_dir():
                entries[relative] = ("folder",)
            else:
                entries[relative] = ("file", path.read_bytes())
    return entries


def _replace_whole(folder: Path, force: bool, export: bool) -> int:
    """Merge's or export's destination check, then (when it passes) the replacement of the whole folder they make."""
    from tuner.export import ExportRefused
    from tuner.export.exporter import check_output
    from tuner.fileio import staged_directory
    from tuner.infer.target import InferenceTarget
    from tuner.loading.merge import check_merge_output
    from tuner.loading.model import ModelLoadError
    from tuner.rundir.manifest import record_files

    run = folder.parent / "some-run"
    try:
        if export:
            check_output(folder, InferenceTarget(_demo(run), str(run / FINAL_DIR), str(run / FINAL_DIR), run_dir=run),
                         force)
        else:
            check_merge_output(folder, run / FINAL_DIR, force)
    except (ModelLoadError, ExportRefused):
        return 2
    with staged_directory(folder, existing="replace") as staging:
        (staging / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}      ")
        record_files(staging, ["model.safetensors"], "tuner merge")
    return 0


def command(case: dict, folder: Path) -> int:
    """Run the case's command on ``folder``; its exit code (an exception that escapes is the caller's traceback)."""
    from tuner.cli import main

    force = ["--force"] if case["force"] else []
    name = case["command"]
    if name in ("merge", "export"):
        return _replace_whole(folder, case["force"], export=name == "export")
    if name == "adopt":  # takes no --force: the user has looked, and asks
        force = []
    argv = {"render": ["render", "demo", "-o", str(folder)],
            "run --dry-run": ["run", "demo", "--set", f"output.dir={folder}", "--dry-run"],
            "run --resume --dry-run": ["run", "demo", "--set", f"output.dir={folder}", "--resume", "--dry-run"],
            "presets cp": ["presets", "cp", str(folder)], "adopt": ["adopt", str(folder)]}[name]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(argv + force)


def run_case(case: dict, root: Path) -> dict:
    """Build the case under ``root`` (an empty folder), run it, and say what changed that was not tuner's."""
    from tuner.rundir.manifest import looks_older, proved, read_manifest

    folder, outside = root / "work" / "v", root / "outside"
    (outside / "dir").mkdir(parents=True)
    (root / "work").mkdir()
    (outside / "target.txt").write_text("outside the folder\n")
    (outside / "dir" / "kept.txt").write_text("outside, in a folder\n")
    build(case, folder, outside)
    before, before_outside = snapshot(folder), snapshot(outside)
    tuners = set(proved(folder)) | ({MANIFEST} if folder.is_dir() and read_manifest(folder) is not None else set())
    if case["command"] == "adopt" and folder.is_dir() and looks_older(folder):
        tuners.add(MANIFEST)  # an older tuner's list of names, which the user asks tuner to replace by its manifest
    outcome = {"exit": None, "traceback": None, "lost": []}
    cwd = os.getcwd()
    os.chdir(root / "work")
    try:
        outcome["exit"] = command(case, folder)
    except BaseException:  # noqa: BLE001 - what a user would see as a traceback
        outcome["traceback"] = traceback.format_exc(limit=-3)
    finally:
        os.chdir(cwd)
    after = snapshot(folder)
    outcome["lost"] = sorted(relative for relative, entry in before.items()
                             if relative.split("/")[0] not in tuners and after.get(relative) != entry)
    outcome["lost"] += [f"outside/{relative}" for relative, entry in before_outside.items()
                        if snapshot(outside).get(relative) != entry]
    return outcome


def campaign(seed: int, cases: int) -> tuple[Counter, list[tuple[dict, dict]], float]:
    rng = random.Random(seed)
    tally: Counter = Counter()
    bad = []
    started = time.perf_counter()
    for _ in range(cases):
        case = random_case(rng)
        with tempfile.TemporaryDirectory(prefix="tuner-hostile-") as root:
            outcome = run_case(case, Path(root))
        forced = case["force"] and case["command"] != "adopt"
        tally[f"{case['command']}{' --force' if forced else ''}: exit {outcome['exit']}"] += 1
        tally["data loss"] += bool(outcome["lost"])
        tally["tracebacks"] += bool(outcome["traceback"])
        tally[f"base {case['base']}"] += 1
        if outcome["lost"] or outcome["traceback"] or outcome["exit"] not in (0, 2):
            bad.append((case, outcome))
    return tally, bad, time.perf_counter() - started


def report(seed: int, cases: int, tally: Counter, bad: list, seconds: float) -> str:
    lines = [f"# Hostile folders, {time.strftime('%Y-%m-%d')} (CPU)", "",
             f"`python -m benchmarks.hostile_folders --seed {seed} --cases {cases}`: {cases} folders in {seconds:.0f} s.",
             "", f"- data loss (a byte, link or folder tuner had not written changed): **{tally['data loss']}**",
             f"- tracebacks: **{tally['tracebacks']}**",
             f"- other exit codes than 0 and 2: **{sum(1 for _, o in bad if o['exit'] not in (0, 2, None))}**", "",
             "| what | cases |", "|---|---|"]
    lines += [f"| {key} | {count} |" for key, count in sorted(tally.items())
              if key not in ("data loss", "tracebacks")]
    for case, outcome in bad[:20]:
        lines += ["", f"- {case}: {outcome}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=600)
    parser.add_argument("--out", type=Path, default=None, help="the report (default: print it only)")
    args = parser.parse_args(argv)
    tally, bad, seconds = campaign(args.seed, args.cases)
    text = report(args.seed, args.cases, tally, bad, seconds)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
