"""What checkpoint integrity costs at save and at resume, before and after issue 29 took hashing out of the loop.

Writes one checkpoint of 3 GiB of safetensors weights and a 1 GiB optimizer state saved by ``torch.save`` (a zip
archive), plus the small JSON files a Trainer writes, in a temporary folder under /tmp (deleted after), then times:

- save: the old callback's SHA-256 of every file (rank 0, inside the loop, every other rank waiting in a
  collective) against :func:`tuner.rundir.integrity.saved_files` (sizes, safetensors header, zip directory, JSON);
- resume: the old check (the same structure checks, then the SHA-256 of every file, on every rank) against
  :func:`tuner.rundir.integrity.checkpoint_problem` (sizes and structure) and against ``verify=True`` (what
  ``tuner run --resume --verify`` does, once, before launch), for a new checkpoint and for an old one with digests.

Each is timed warm (the files just written, in the page cache) and cold: each file's cached pages are dropped
with ``posix_fadvise(DONTNEED)`` first, file by file, since dropping the whole page cache
(``/proc/sys/vm/drop_caches``) would also slow every other job on the machine.
Run: nice -n 10 python benchmarks/checkpoint_integrity.py   (results in benchmarks/results/checkpoint_integrity.*)
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GIB = 1024 ** 3
WEIGHTS_GIB, OPTIMIZER_GIB = 3, 1
TENSOR_BYTES = 64 * 1024 * 1024
REPEATS = 3
RESULTS = REPO / "benchmarks" / "results"


def old_file_digests(directory: Path) -> dict[str, dict]:
    """The save-side hashing tuner did before issue 29 (``file_digests``, kept here as the reference)."""
    from tuner.rundir.layout import CHECKPOINT_INFO

    digests = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != CHECKPOINT_INFO:
            with open(path, "rb") as stream:
                digest = hashlib.file_digest(stream, "sha256").hexdigest()
            digests[path.relative_to(directory).as_posix()] = {"size": path.stat().st_size, "sha256": digest}
    return digests


def old_resume_check(directory: Path, digests: dict[str, dict]) -> str | None:
    """The resume-side check before issue 29: every structure check, then every recorded SHA-256."""
    from tuner.rundir.integrity import checkpoint_problem

    problem = checkpoint_problem(directory)
    if problem:
        return problem
    for name, expected in sorted(digests.items()):
        with open(directory / name, "rb") as stream:
            if hashlib.file_digest(stream, "sha256").hexdigest() != expected["sha256"]:
                return f"{name}: changed"
    return None


def write_checkpoint(directory: Path) -> dict[str, float]:
    """A checkpoint laid out as the Trainer writes one; returns how long each big file took to write."""
    import torch

    directory.mkdir()
    block = os.urandom(TENSOR_BYTES)
    count = WEIGHTS_GIB * GIB // TENSOR_BYTES
    elements = TENSOR_BYTES // 2
    header = {f"model.layers.{i}.weight": {"dtype": "BF16", "shape": [elements // 4096, 4096],
                                            "data_offsets": [i * TENSOR_BYTES, (i + 1) * TENSOR_BYTES]}
              for i in range(count)}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    started = time.perf_counter()
    with open(directory / "model.safetensors", "wb") as stream:
        stream.write(struct.pack("<Q", len(encoded)) + encoded)
        for _ in range(count):
            stream.write(block)
        stream.flush()
        os.fsync(stream.fileno())
    weights_s = time.perf_counter() - started
    state = {f"state.{i}.exp_avg": torch.frombuffer(bytearray(block), dtype=torch.bfloat16)
             for i in range(OPTIMIZER_GIB * GIB // TENSOR_BYTES)}
    started = time.perf_counter()
    torch.save(state, directory / "optimizer.pt")
    with open(directory / "optimizer.pt", "rb") as stream:
        os.fsync(stream.fileno())
    optimizer_s = time.perf_counter() - started
    del state
    torch.save({"python": [1, 2, 3]}, directory / "rng_state.pth")
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": 500, "log_history": []}))
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (directory / "recipe.lock.yaml").write_text("version: 1\n")
    return {"write_weights_s": weights_s, "write_optimizer_s": optimizer_s}


def drop_cached_pages(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(action, directory: Path, cold: bool) -> float:
    if cold:
        drop_cached_pages(directory)
    else:
        action()  # a first pass brings every file into the page cache
    runs = []
    for _ in range(1 if cold else REPEATS):
        started = time.perf_counter()
        action()
        runs.append(time.perf_counter() - started)
    return round(statistics.median(runs), 4)


def main() -> None:
    from tuner.rundir.integrity import checkpoint_problem, saved_files
    from tuner.rundir.layout import CHECKPOINT_INFO

    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        checkpoint = Path(scratch) / "checkpoint-500"
        writes = write_checkpoint(checkpoint)
        sizes = {path.name: path.stat().st_size for path in checkpoint.iterdir()}
        digests = old_file_digests(checkpoint)
        files, problem = saved_files(checkpoint)
        assert problem is None
        (checkpoint / CHECKPOINT_INFO).write_text(json.dumps({"step": 500, "settings": {}, "files": files}))
        old_format = Path(scratch) / "old-format"
        old_format.mkdir()
        for path in checkpoint.iterdir():  # the same files, an info file holding digests (hard links: no copy)
            if path.name != CHECKPOINT_INFO:
                os.link(path, old_format / path.name)
        (old_format / CHECKPOINT_INFO).write_text(json.dumps({"step": 500, "settings": {}, "files": digests}))
        measures = {
            "save: old, SHA-256 of every file": lambda: old_file_digests(checkpoint),
            "save: new, sizes + structure": lambda: saved_files(checkpoint),
            "resume: old, structure + SHA-256 (per rank)": lambda: old_resume_check(checkpoint, digests),
            "resume: new, sizes + structure": lambda: checkpoint_problem(checkpoint),
            "resume --verify: new checkpoint (zip CRC, read-through)": lambda: checkpoint_problem(checkpoint, True),
            "resume --verify: old checkpoint (recorded SHA-256)": lambda: checkpoint_problem(old_format, True),
        }
        assert old_resume_check(checkpoint, digests) is None and checkpoint_problem(checkpoint, True) is None
        assert checkpoint_problem(old_format, True) is None
        results = {"warm": {name: timed(action, checkpoint, cold=False) for name, action in measures.items()},
                   "cold": {name: timed(action, checkpoint, cold=True) for name, action in measures.items()}}
    report = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.processor() or platform.machine()}, "
                                                      f"{os.cpu_count()} CPUs (shared with other jobs)",
        "python": platform.python_version(), "files_bytes": sizes, "total_gib": round(sum(sizes.values()) / GIB, 3),
        "repeats_warm": REPEATS, "seconds": results, **{key: round(value, 2) for key, value in writes.items()},
        "page_cache": "warm: files just written and read once before timing (median of 3); cold: each file's "
                      "cached pages dropped with posix_fadvise(DONTNEED) before one run (the whole cache is not "
                      "dropped: /proc/sys/vm/drop_caches would slow the other jobs sharing this machine)",
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "checkpoint_integrity.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# Checkpoint integrity: save and resume checks ({report['date']})", "",
             f"{report['total_gib']} GiB checkpoint (3 GiB model.safetensors, 1 GiB optimizer.pt from torch.save, "
             f"small JSON), {report['machine']}; written in {writes['write_weights_s']:.1f} s + "
             f"{writes['write_optimizer_s']:.1f} s (fsync'd). {report['page_cache']}.", "",
             "| check | warm s | cold s |", "|---|---:|---:|"]
    lines += [f"| {name} | {results['warm'][name]} | {results['cold'][name]} |" for name in measures]
    (RESULTS / "checkpoint_integrity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
