"""What a probe measured, kept under ``$TUNER_HOME/probes/`` so a later ``tuner plan`` of the same setup can say
"measured on this machine on DATE: X GiB (plan Y)" beside its prediction — never instead of it.

A record is keyed by what decides the memory of a run: this machine's devices, the library versions, the model and
the recipe's tactics (method, memory, parallelism, objective, world size, packing).  The key is computed without
torch, from /proc and package metadata, so ``tuner plan`` pays a few file reads and only when records exist.
"""
from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tuner.fileio import atomic_write_text
from tuner.home import tuner_home
from tuner.recipe.schema import Recipe

RECORDS_DIR = "probes"  # under $TUNER_HOME
VERSIONED = ("torch", "transformers", "accelerate", "deepspeed", "peft", "bitsandbytes", "trl")
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The processor's model name, from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


@lru_cache(maxsize=1)
def gpu_names() -> tuple[str, ...]:
    """The NVIDIA GPUs the driver lists (its /proc files: no torch, no subprocess); empty where it lists none."""
    names = []
    for information in sorted(NVIDIA_GPUS.glob("*/information")) if NVIDIA_GPUS.is_dir() else []:
        try:
            for line in information.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return tuple(names)


def machine_devices(recipe: Recipe) -> list[str]:
    """The devices of this machine that the recipe trains on: its GPUs, or its CPU."""
    if recipe.uses_gpu:
        return list(gpu_names()) or ["GPU (not listed by the NVIDIA driver)"]
    return [cpu_name()]


@lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, str | None], ...]:
    from importlib.metadata import PackageNotFoundError, version

    from tuner import __version__

    versions: list[tuple[str, str | None]] = [("tuner", __version__)]
    for name in VERSIONED:
        try:
            versions.append((name, version(name)))
        except PackageNotFoundError:
            versions.append((name, None))
    return tuple(versions)


def library_versions() -> dict[str, str | None]:
    """tuner's and the training libraries' versions (read once per process: they do not change under it)."""
    return dict(_versions())


def _model_key(recipe: Recipe) -> dict:
    model_id = recipe.model.id
    if Path(model_id).expanduser().is_dir():  # a local folder is the same model wherever it is named from
        model_id = str(Path(model_id).expanduser().resolve())
    return {"id": model_id, "revision": recipe.model.revision, "dtype": recipe.model.dtype}


def _tactics_key(recipe: Recipe) -> dict:
    data = recipe.model_dump(mode="json")
    batch = {key: data["training"][key] for key in ("micro_batch_size", "gradient_accumulation_steps", "max_seq_length",
                                                    "optimizer")}
    return {"method": data["method"], "memory": {**data["memory"], **batch}, "parallelism": data["parallelism"],
            "objective": data["objective"], "machines": recipe.hardware.machines,
            "gpus_per_machine": recipe.hardware.gpus_per_machine, "world_size": recipe.world_size,
            "packing": recipe.data.packing, "evaluates": recipe.data.eval_fraction > 0}


def record_key(recipe: Recipe) -> dict:
    return {"devices": machine_devices(recipe), "versions": library_versions(), "model": _model_key(recipe),
            "tactics": _tactics_key(recipe)}


def _record_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return tuner_home() / RECORDS_DIR / f"{digest}.json"


@dataclass(frozen=True)
class MeasuredRecord:
    date: str  # YYYY-MM-DD, local time of the probe
    measured_gib: float  # the probe's peak on the training device (per GPU; the CPU: every process together)
    planned_gib: float | None  # the plan's prediction of the same, when the probe ran
    measured: str  # what measured_gib is
    probe_report: str  # the probe.json it came from

    def line(self, planned_gib: float | None) -> str:
        """The line ``tuner plan`` prints beside its own prediction (``planned_gib``: the plan now)."""
        plan = f" (plan {planned_gib:.2f} GiB)" if planned_gib is not None else ""
        return f"measured on this machine on {self.date}: {self.measured_gib:.2f} GiB{plan}; {self.measured}"


def save_record(recipe: Recipe, record: MeasuredRecord) -> Path:
    key = record_key(recipe)
    return atomic_write_text(_record_path(key), json.dumps({"key": key, **record.__dict__}, indent=2) + "\n")


def measured_record(recipe: Recipe) -> MeasuredRecord | None:
    """The record of a probe of the same setup on this machine, or None (at once when no probe was ever kept)."""
    if not (tuner_home() / RECORDS_DIR).is_dir():
        return None
    path = _record_path(record_key(recipe))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return MeasuredRecord(str(data["date"]), float(data["measured_gib"]),
                              None if data.get("planned_gib") is None else float(data["planned_gib"]),
                              str(data["measured"]), str(data["probe_report"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none, or not one tuner wrote: the plan stands alone
