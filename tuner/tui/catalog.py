"""Models the Model screen offers and the architecture facts it shows for each.

Facts come from :func:`tuner.catalog.models.model_facts` (the same the planner uses):
the demo model, local directories, the shipped catalog and hub configs (fetched once, kept under $TUNER_HOME).
The layer kinds and the parts no memory term covers are the planner's own (``ModelFacts.layer_kinds`` and
``ModelFacts.unmodelled``: a plan of such a model has the verdict ``cannot judge``), so the screen shows the
same judgement ``tuner plan`` gives, without a rule of its own.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from tuner.catalog.demo import DEMO_MODEL_ID
from tuner.catalog.model_config import UnknownModelError
from tuner.catalog.models import catalog_ids, model_facts
from tuner.planner.items import CANNOT_JUDGE
from tuner.planner.vision import describe_parts

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
    ("experts_per_token", "experts / token"),
    ("tie_word_embeddings", "tied embeddings"),
)
SIZE = re.compile(r"(?:\d+x)?(\d+(?:\.\d+)?)([kmb])")  # 8b, 1.5b, 135m, 8x7b


@dataclass(frozen=True)
class ModelEntry:
    id: str
    summary: str  # family, parameter count, active parameters of a MoE model: one line for the list
    size: str = ""  # parameter count, e.g. 8.0B
    facts: dict[str, object] = field(default_factory=dict)
    source: str = ""
    layer_kinds: tuple[str, ...] = ()  # "48 x attention + MoE": the planner's grouping of the decoder layers
    cannot_judge: tuple[str, ...] = ()  # parts no memory term covers: every plan of this model gives no verdict
    parts: tuple[str, ...] = ()  # an image-text model's vision tower, projector and language model, one line each
    error: str = ""  # why there are no facts (the CLI's words: an unknown id, a hub that refused or is unreachable)

    @property
    def judgement_lines(self) -> list[str]:
        """One line per part the planner cannot judge, in the words of the plan's verdict."""
        return [f"{CANNOT_JUDGE}: {part} — no memory terms, no fit verdict" for part in self.cannot_judge]

    def matches(self, query: str) -> bool:
        """Every word of ``query`` is in the id or summary; a size ("8b", "1.5B") must be a whole size,
        so "8b" finds 8B models and not 3.8B, 14.8B or 32.8B ones."""
        haystack = f"{self.id} {self.summary} {self.facts.get('family', '')}".lower()
        sizes = {_size(word) for word in re.split(r"[^a-z0-9.]+", haystack)} - {None}
        return all(_size(word) in sizes if _size(word) else word in haystack for word in query.lower().split())


def _size(word: str) -> str | None:
    """'8b', '8.0b' and '8x8b' (per expert) -> '8b'; None for a word that is not a model size."""
    match = SIZE.fullmatch(word.lower())
    if not match:
        return None
    number = match.group(1).rstrip("0").rstrip(".") if "." in match.group(1) else match.group(1)
    return f"{number}{match.group(2)}"


def _params(count: int) -> str:
    """1.2B, 596M, 739K (rounded as shown: 999.9M is 1.0B)."""
    return (f"{count / 1e9:.1f}B" if count >= 999.5e6 else f"{count / 1e6:.0f}M" if count >= 999.5e3
            else f"{count / 1e3:.0f}K")


def _entry(model_id: str, facts) -> ModelEntry:
    data = facts.as_dict()
    shown = {label: data[key] for key, label in FACT_LABELS if data.get(key) not in (None, 0) or key == "tie_word_embeddings"}
    total = data["params"]["total"]
    shown["parameters"] = f"{total:,}"
    moe = ""
    if facts.is_moe:  # a token runs through its routed experts only: what it computes, not what memory holds
        shown = _moe_widths(shown, facts.layer_kinds)
        active = facts.active_params()
        shown["active / total"] = f"{_params(active)} of {_params(total)}"
        moe = f"  MoE A{_params(active)}"  # as the model names say it (Qwen3-30B-A3B: 3B active)
    # one row of the list: the context is on the facts panel (a wide row would wrap in 120 columns)
    summary = f"{data['model_type']:<11.11} {_params(total):>6}{moe}"
    return ModelEntry(model_id, summary, size=_params(total), facts=shown, source=facts.source,
                      layer_kinds=tuple(data["layer_kinds"]), cannot_judge=tuple(data["unmodelled"]),
                      parts=tuple(describe_parts(facts.inventory)) if facts.inventory else ())


def _moe_widths(shown: dict[str, object], kinds) -> dict[str, object]:
    """A MoE model's MLP widths as its layers have them: each expert's (and a shared expert's), and the config's dense
    width only where some layer is dense (Qwen3-30B-A3B's 6144 is no layer's: its experts are 768 wide)."""
    moe = [kind.dims for kind in kinds if kind.mlp == "moe"]
    widths = {"expert width": ", ".join(dict.fromkeys(str(dims["expert_width"]) for dims in moe))}
    shared = {dims.get("shared_width", 0) for dims in moe} - {0}
    if shared:
        widths["shared expert width"] = ", ".join(map(str, sorted(shared)))
    dense = any(kind.mlp == "dense" for kind in kinds)
    out = {}
    for label, value in shown.items():
        if label == "MLP width":
            out.update({"MLP width (dense layers)": value} if dense else {})
            out.update(widths)
        else:
            out[label] = value
    return out if "expert width" in out else {**out, **widths}


@functools.cache
def catalog_entries() -> list[ModelEntry]:
    """The demo model first, then the offline catalog (its facts are shipped: worked out once per process, the
    wizard does it while the Start screen is shown)."""
    return [_entry(model_id, model_facts(model_id)) for model_id in [DEMO_MODEL_ID, *catalog_ids()]]


def describe_model(model_id: str, entries: list[ModelEntry]) -> ModelEntry:
    """The entry of any model id: listed, or read as the planner reads it (a local directory, the hub's config.json),
    or one whose ``error`` says why there are no facts, in the words ``tuner plan`` prints (a hub that refused or
    cannot be reached: :class:`~tuner.catalog.hub.HubError`, asked once per process)."""
    for entry in entries:
        if entry.id == model_id:
            return entry
    try:
        return _entry(model_id, model_facts(model_id))
    except UnknownModelError as exc:
        return ModelEntry(model_id, "", error=str(exc))
