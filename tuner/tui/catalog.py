"""Models the Model screen offers and the architecture facts it shows for each.

Facts come from the offline catalog (:mod:`tuner.catalog.models`) when it is installed,
from the demo model's own config, or from a local directory's ``config.json``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

FACT_KEYS = (
    ("hidden_size", "hidden size"),
    ("num_hidden_layers", "layers"),
    ("num_attention_heads", "attention heads"),
    ("num_key_value_heads", "key/value heads"),
    ("intermediate_size", "MLP width"),
    ("vocab_size", "vocabulary"),
    ("max_position_embeddings", "context"),
    ("tie_word_embeddings", "tied embeddings"),
)


@dataclass(frozen=True)
class ModelEntry:
    id: str
    family: str
    summary: str  # size, context, parameter count: one line for the list
    facts: dict[str, object] = field(default_factory=dict)

    def matches(self, query: str) -> bool:
        words = query.lower().split()
        haystack = f"{self.id} {self.family} {self.summary}".lower()
        return all(word in haystack for word in words)


def demo_entry() -> ModelEntry:
    from tuner.builtin.model import DEMO_CONFIG

    facts = {label: DEMO_CONFIG[key] for key, label in FACT_KEYS if key in DEMO_CONFIG}
    return ModelEntry("builtin:demo", "llama", f"~0.8M params, context {DEMO_CONFIG['max_position_embeddings']}, "
                      "built on this machine", facts)


def catalog_entries() -> list[ModelEntry]:
    """The demo model first, then the offline catalog (empty until tuner.catalog.models exists)."""
    entries = [demo_entry()]
    try:
        from tuner.catalog import models as catalog
    except ImportError:
        return entries
    for spec in _catalog_specs(catalog):
        entries.append(_entry_from_spec(spec))
    return entries


def _catalog_specs(catalog) -> list:
    for name in ("MODELS", "CATALOG"):
        found = getattr(catalog, name, None)
        if found:
            return list(found.values()) if isinstance(found, dict) else list(found)
    lister = getattr(catalog, "known_models", None) or getattr(catalog, "list_models", None)
    return list(lister()) if lister else []


def _entry_from_spec(spec) -> ModelEntry:
    facts = {label: getattr(spec, key) for key, label in FACT_KEYS if getattr(spec, key, None) is not None}
    params = getattr(spec, "parameters", None) or getattr(spec, "num_parameters", None)
    context = facts.get("context")
    summary = ", ".join(filter(None, [
        f"{params / 1e9:.1f}B params" if params else "",
        f"context {context}" if context else "",
    ]))
    model_id = getattr(spec, "id", None) or getattr(spec, "hub_id", None) or getattr(spec, "name")
    return ModelEntry(str(model_id), str(getattr(spec, "family", "")), summary, facts)


def facts_for(model_id: str, entries: list[ModelEntry]) -> tuple[str, dict[str, object]]:
    """(where the facts come from, facts) for a model id: catalog, local config.json or nothing."""
    for entry in entries:
        if entry.id == model_id:
            return "catalog", entry.facts
    config = Path(model_id).expanduser() / "config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return f"{config}: unreadable ({exc})", {}
        return str(config), {label: data[key] for key, label in FACT_KEYS if key in data}
    return "not in the offline catalog; the planner needs its config.json (local directory or hub cache)", {}
