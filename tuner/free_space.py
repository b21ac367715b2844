"""Room on disk, found before a run rather than at its first checkpoint hours in: for the checkpoints under
output.dir, an offload folder, and a hub model's download into the Hugging Face cache, together where they share a
filesystem."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.catalog.hub import human_bytes
from tuner.disk_messages import disk_size, existing_parent
from tuner.check import Check
from tuner.planner.disk import checkpoint_disk_gib
from tuner.planner.items import GIB
from tuner.recipe.schema import Recipe

if TYPE_CHECKING:
    from tuner.loading.hub_download import HubDownload
    from tuner.planner.items import MemoryPlan

MIN_FREE_DISK_GIB = 10.0  # without a plan to size checkpoints: below this a long run will likely stop


def _writable(directory: Path) -> str | None:
    """None when a file can be created in ``directory`` (root ignores mode bits, so try it); else why not."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".tuner-doctor-"):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def _disk_paths(recipe: Recipe | None) -> dict[str, Path]:
    if recipe is None:
        return {"output": Path("runs")}
    paths = {"output": Path(recipe.output.dir)}
    if recipe.hardware.nvme_path and "nvme" in (recipe.memory.offload_optimizer, recipe.memory.offload_params):
        paths["nvme offload"] = Path(recipe.hardware.nvme_path)
    if recipe.inference.offload_folder:
        paths["inference offload"] = Path(recipe.inference.offload_folder)
    return paths


def disk_room(recipe: Recipe | None, planned: MemoryPlan | None, download: HubDownload | None = None) -> Check:
    """Room for the run's checkpoints on the output disk and, with ``download``, for the hub model's files not yet in
    the Hugging Face cache; where both land on one filesystem, for the two together.  ``planned``: the recipe's
    memory plan, which sizes the checkpoints (None: no size known, so only warn when little is left)."""
    needed = checkpoint_disk_gib(recipe, planned) if recipe is not None and planned is not None else None
    paths = _disk_paths(recipe)
    if download is not None and download.missing:
        paths["model download"] = Path(download.cache_dir)
    problems, warnings, found = _room(paths, {"output": needed}, download)
    if problems:
        fix = "choose a writable output.dir with room, free space, or lower training.save_total_limit"
        return Check("disk", "fail", "; ".join(problems + warnings), fix + _DOWNLOAD_FIX * _download_short(problems))
    if warnings:
        return Check("disk", "warn", "; ".join(warnings), "free space before a long run (checkpoints need room)")
    suffix = f"; checkpoints need ~{disk_size(needed * GIB)}" if needed is not None else ""
    if download is not None and download.missing:
        suffix += f"; the model's download {human_bytes(download.missing_bytes)}"
    return Check("disk", "ok", "; ".join(found) + suffix)


_DOWNLOAD_FIX = "; or put the Hugging Face cache on a disk with room (HF_HOME or HF_HUB_CACHE)"


def _download_short(problems: list[str]) -> bool:
    return any(problem.startswith("model download") for problem in problems)


def check_download_room(download: HubDownload) -> Check:
    """Room in the Hugging Face cache for a hub model's files not downloaded yet (inference: nothing else to count)."""
    problems, _, found = _room({"model download": Path(download.cache_dir)}, {}, download)
    if problems:
        return Check("disk", "fail", "; ".join(problems), "free space" + _DOWNLOAD_FIX)
    return Check("disk", "ok", "; ".join(found))


def _room(paths: dict[str, Path], needs_gib: dict[str, float | None], download: HubDownload | None
          ) -> tuple[list[str], list[str], list[str]]:
    """(problems, warnings, what was found) for each role's path; roles on one filesystem need room together."""
    problems, warnings, found = [], [], []
    if download is not None:
        needs_gib = {**needs_gib, "model download": download.missing_bytes / GIB}
    demanded: dict[int, float] = {}  # filesystem (st_dev) -> GiB the roles so far need on it
    for role, path in paths.items():
        where = existing_parent(path)
        why = _writable(where)
        if why:
            problems.append(f"{role} {path}: cannot write in {where} ({why})")
            continue
        free = shutil.disk_usage(where).free / GIB
        found.append(f"{role} {path}: {disk_size(free * GIB)} free")
        want = needs_gib.get(role)
        if want is None:  # no size to check against (no plan, an offload folder): warn when little is left
            if free < MIN_FREE_DISK_GIB:
                warnings.append(f"{role} {path}: only {disk_size(free * GIB)} free")
            continue
        device = os.stat(where).st_dev
        shared = demanded.get(device, 0.0)
        demanded[device] = shared + want
        if free < shared + want:
            what = (f"the download of {download.model_id} needs {human_bytes(download.missing_bytes)}"
                    if role == "model download" else f"checkpoints need ~{disk_size(want * GIB)}")
            beside = f", and the output on the same disk ~{disk_size(shared * GIB)} more" if shared else ""
            problems.append(f"{role} {path}: {disk_size(free * GIB)} free, {what}{beside}")
    return problems, warnings, found
