"""Models the Model screen offers and the architecture facts it shows for each.

Facts come from :func:`tuner.catalog.models.model_facts` (the same the planner uses):
the demo model, local directories, the shipped catalog and the hub cache.  Until that
module is installed, only the demo model is listed, with its own config.
"""
from __future__ import annotations

from dataclasses import dataclass, field

FACT_LABELS = (
    ("model_type", "family"),
    ("hidden_size", "hidden size"),
    ("num_layers", "layers"),
    ("num_heads", "attention heads"),
    ("num_kv_heads", "key/value heads"),
    ("intermediate_size", "MLP width"),
    ("vocab_size", "vocabulary"),
    ("max_position_embeddings", "context"),
    ("num_experts", "experts"),
    ("tie_word_embeddings", "tied embeddings"),
)
DEMO_ID = "builtin:demo"


@dataclass(frozen=True)
class ModelEntry:
    id: str
    summary: str  # family, parameter count, context: one line for the list
    facts: dict[str, object] = field(default_factory=dict)
    source: str = ""

    def matches(self, query: str) -> bool:
        haystack = f"{self.id} {self.summary}".lower()
        return all(word in haystack for word in query.lower().split())


def _params(count: int) -> str:
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M" if count >= 1e6 else f"{count / 1e3:.0f}K"


def _entry(model_id: str, facts) -> ModelEntry:
    data = facts.as_dict()
    shown = {label: data[key] for key, label in FACT_LABELS if data.get(key) not in (None, 0) or key == "tie_word_embeddings"}
    shown["parameters"] = f"{data['params']['total']:,}"
    context = data.get("max_position_embeddings")
    summary = f"{data['model_type']:<8} {_params(data['params']['total']):>6}" + (
        f"  ctx {context // 1024}K" if context and context >= 1024 else f"  ctx {context}" if context else "")
    return ModelEntry(model_id, summary, shown, facts.source)


def _demo_without_catalog() -> ModelEntry:
    from tuner.catalog.demo import DEMO_CONFIG

    return ModelEntry(DEMO_ID, "llama      ~0.8M  ctx 256",
                      {"hidden size": DEMO_CONFIG["hidden_size"], "layers": DEMO_CONFIG["num_hidden_layers"],
                       "context": DEMO_CONFIG["max_position_embeddings"]}, "builtin demo model")


def catalog_entries() -> list[ModelEntry]:
    """The demo model first, then the offline catalog."""
    try:
        from tuner.catalog.models import catalog_ids, model_facts
    except ImportError:
        return [_demo_without_catalog()]
    return [_entry(model_id, model_facts(model_id)) for model_id in [DEMO_ID, *catalog_ids()]]


def describe_model(model_id: str, entries: list[ModelEntry]) -> tuple[str, dict[str, object]]:
    """(where the facts come from, facts) for any model id, or (why there are none, {})."""
    for entry in entries:
        if entry.id == model_id:
            return entry.source, entry.facts
    try:
        from tuner.catalog.models import UnknownModelError, model_facts
    except ImportError:
        return "no architecture facts: the model catalog is not in this build", {}
    try:
        entry = _entry(model_id, model_facts(model_id))
    except UnknownModelError as exc:
        return str(exc), {}
    return entry.source, entry.facts
