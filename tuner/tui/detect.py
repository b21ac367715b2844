"""This machine's NVIDIA GPUs and RAM, for the Hardware screen to prefill (no torch import: the UI must start fast)."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from tuner.catalog.gpus import GPUS

MEMORY_TOLERANCE = 0.1  # a catalog entry matches when its memory is within 10% of what the driver reports


@dataclass(frozen=True)
class DetectedGpus:
    count: int
    name: str  # as the driver reports it
    memory_gib: float

    def catalog_name(self) -> str | None:
        """The catalog GPU the driver's name contains with the closest memory (A100 40 vs 80 GB), if any."""
        reported = self.name.lower().replace(" ", "").replace("-", "")
        candidates = [spec for spec in GPUS.values() if spec.name.split("-")[0].lower() in reported
                      and abs(spec.memory_gib - self.memory_gib) <= MEMORY_TOLERANCE * self.memory_gib]
        best = min(candidates, key=lambda spec: abs(spec.memory_gib - self.memory_gib), default=None)
        return best.name if best else None

    def recipe_changes(self) -> dict:
        """The hardware section for this machine: a catalog GPU, else a custom size."""
        catalog = self.catalog_name()
        return {"hardware.gpus_per_machine": self.count, "hardware.gpu": catalog or f"{self.memory_gib:.0f}GB",
                "hardware.gpu_memory_gb": None if catalog else round(self.memory_gib, 1)}


def detect_gpus() -> DetectedGpus | None:
    """NVIDIA GPUs of this machine from nvidia-smi (no torch import: the UI must start fast)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out)


def parse_nvidia_smi(out: str) -> DetectedGpus | None:
    """``name, MiB`` per line (``--query-gpu=name,memory.total --format=csv,noheader,nounits``)."""
    rows = [line.rsplit(",", 1) for line in out.strip().splitlines() if "," in line]
    try:
        return DetectedGpus(len(rows), rows[0][0].strip(), float(rows[0][1]) / 1024) if rows else None
    except ValueError:  # "[N/A]" memory on some virtual GPUs
        return None


def machine_ram_gib() -> float:
    """This machine's RAM in GiB, to one decimal (what the Hardware screen shows, prefills and Auto-fit assumes)."""
    import psutil

    from tuner.planner.items import GIB

    return round(psutil.virtual_memory().total / GIB, 1)
