"""Rebuild the inventories tuner ships (``make inventories``): one per catalog entry and built-in model, built on
the meta device.  The catalog's top: it reads the catalog's entries and builds them, so nothing below it has to
know the catalog to make an inventory.
"""
from __future__ import annotations

from tuner.catalog.inventory import SHIPPED_DIR, config_key, shipped_path
from tuner.catalog.meta_inventory import build_inventory
from tuner.catalog.models import builtin_configs, catalog_config, catalog_ids
from tuner.fileio import atomic_write_text


def ship_catalog_inventories() -> list[str]:
    """Rebuild the shipped inventory of every catalog entry and of the built-in models, and remove the ones no
    entry uses any more; returns the files written."""
    configs = {**builtin_configs(), **{key: catalog_config(key) for key in catalog_ids()}}
    written = []
    for name, config in configs.items():
        path = shipped_path(config_key(config))
        atomic_write_text(path, build_inventory(config, name).to_json())
        written.append(path.name)
    for stale in SHIPPED_DIR.glob("*.json"):
        if stale.name not in written:
            stale.unlink()
    return written


if __name__ == "__main__":
    print(f"wrote {len(ship_catalog_inventories())} inventories")
