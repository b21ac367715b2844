"""GPU catalog: usable memory and bf16 support of common accelerators.

Memory is the marketed capacity in GB (10^9 bytes) as reported by vendors;
the planner converts to GiB.  ``"48GB"`` style names describe a custom card.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float
    bf16: bool
    peak_bf16_tflops: float | None = None


# memory_gib values are what torch.cuda.get_device_properties().total_memory reports, in GiB.
GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("T4", 15.0, False, 65.0),
        GpuSpec("L4", 22.0, True, 121.0),
        GpuSpec("A10G", 22.0, True, 70.0),
        GpuSpec("RTX3090", 24.0, True, 71.0),
        GpuSpec("RTX4090", 24.0, True, 165.0),
        GpuSpec("L40S", 44.4, True, 362.0),
        GpuSpec("A100-40GB", 39.4, True, 312.0),
        GpuSpec("A100-80GB", 79.2, True, 312.0),
        GpuSpec("H100-80GB", 79.1, True, 989.0),
        GpuSpec("H200", 139.7, True, 989.0),
    )
}

_ALIASES = {
    "a100-80g": "A100-80GB",
    "a100-40g": "A100-40GB",
    "h100": "H100-80GB",
    "h100-80g": "H100-80GB",
    "h200-141gb": "H200",
    "rtx-3090": "RTX3090",
    "rtx-4090": "RTX4090",
    "3090": "RTX3090",
    "4090": "RTX4090",
}

# Names that fit more than one card of the catalog: refused, so a plan never silently assumes the larger one.
_AMBIGUOUS = {"a100": ("A100-40GB", "A100-80GB"), "a100-sxm4": ("A100-40GB", "A100-80GB"),
              "a100-pcie": ("A100-40GB", "A100-80GB")}


class AmbiguousGpuError(KeyError):
    """A GPU name that several catalog cards share; ``str()`` says which and what to write."""

    def __str__(self) -> str:
        return self.args[0]


_CUSTOM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GB|GiB|G)\s*$", re.IGNORECASE)


def lookup_gpu(name: str) -> GpuSpec:
    """Return the spec for a catalog name (case-insensitive) or a custom ``"N GB"`` size.

    Raises KeyError when nothing matches, :class:`AmbiguousGpuError` (a KeyError) when several cards do.
    """
    key = name.strip()
    if key.lower() in _AMBIGUOUS:
        cards = _AMBIGUOUS[key.lower()]
        raise AmbiguousGpuError(f"{name!r} names more than one card ({' or '.join(cards)}); write the one you have, "
                                f"e.g. {cards[-1]}, or its memory, e.g. '{cards[-1].split('-')[-1]}'.")
    for known in GPUS:
        if known.lower() == key.lower():
            return GPUS[known]
    if key.lower() in _ALIASES:
        return GPUS[_ALIASES[key.lower()]]
    match = _CUSTOM.match(key)
    if match:
        return GpuSpec(f"{match.group(1)}GB", float(match.group(1)), True)
    raise KeyError(name)


def known_gpu_names() -> list[str]:
    return list(GPUS)
