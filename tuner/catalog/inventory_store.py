"""Where a model's inventory comes from: the one tuner ships for its catalog, the one cached under
``$TUNER_HOME/inventories/<transformers version>/`` for this config, or one built now on the meta device (and then
cached).  Above both :mod:`tuner.catalog.inventory` (the format) and :mod:`tuner.catalog.meta_inventory` (the
build), so the format never imports the build that makes it.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tuner.catalog.inventory import INVENTORY_FORMAT, Inventory, config_key, shipped_path
from tuner.catalog.model_classes import installed_transformers_version
from tuner.catalog.model_config import UnknownModelError


def cache_path(key: str, transformers_version: str) -> Path:
    from tuner.home import tuner_home

    return tuner_home() / "inventories" / f"transformers-{transformers_version}" / f"{key}.json"


@lru_cache(maxsize=128)
def _read(path: Path) -> Inventory | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # absent, or damaged: built again
    if not isinstance(data, dict) or data.get("format") != INVENTORY_FORMAT:
        return None
    try:
        return Inventory.from_dict(data)
    except TypeError:
        return None


def inventory_for(config: dict, name: str, trust_remote_code: bool = False,
                  code_folder: Path | None = None) -> Inventory:
    """The inventory of the model ``config`` describes: shipped, cached, or built now on the meta device (and
    cached, atomically).  ``name`` is where the config came from, for messages.  PEFT's targets are measured later,
    when a plan needs them (:func:`with_lora`)."""
    key = config_key(config)
    shipped = _read(shipped_path(key))
    if shipped is not None:
        return shipped
    version = installed_transformers_version()
    if version is None:
        raise UnknownModelError(f"{name}: tuner counts a model's parameters by building it on the meta device with "
                                "transformers, which is not installed here: pip install transformers.")
    cached = _read(cache_path(key, version))
    if cached is not None:
        return cached
    from tuner.catalog.meta_inventory import build_inventory  # only when a build is due: not on a plan's path

    return store(build_inventory(config, name, trust_remote_code, lora=False, code_folder=code_folder))


def with_lora(inventory: Inventory, name: str, trust_remote_code: bool = False,
                  code_folder: Path | None = None) -> Inventory:
    """``inventory`` with PEFT's targets measured (once: the result replaces the cached inventory)."""
    if inventory.lora_measured:
        return inventory
    from tuner.catalog.meta_inventory import measure_lora

    return store(measure_lora(inventory, name, trust_remote_code, code_folder))


def store(inventory: Inventory) -> Inventory:
    """Cache ``inventory`` under $TUNER_HOME (atomically) and return it."""
    from tuner.fileio import atomic_write_text

    path = cache_path(inventory.config_sha256, inventory.transformers_version)
    try:
        atomic_write_text(path, inventory.to_json())
    except OSError:
        pass  # a read-only home: plan from the inventory just built, build it again next time
    _read.cache_clear()
    return inventory
