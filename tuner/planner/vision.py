"""The parts of an image-text model in a plan: its vision tower, projector and language model (from the module
tree, :attr:`tuner.catalog.inventory.Inventory.parts`), which of them train (``method.train``), and what tuner
cannot yet judge about them.

A text-only fine-tune of an image-text checkpoint loads the whole model (transformers' image-text class builds the
tower with it) and trains the parts ``method.train`` names; the others are frozen: their weights are counted, they
get no gradients or optimizer states, and text rows never run them (no activations).  The tower's own activations
and the image tokens it adds to the sequence have no terms here yet, so a recipe that trains the tower or the
projector gets no verdict rather than a "fits".
"""
from __future__ import annotations

from tuner.catalog.inventory import LANGUAGE_MODEL, PARTS
from tuner.planner.items import GIB
from tuner.planner.rank_setup import Setup

NAMES = {"vision_tower": "vision tower", "projector": "projector", "language_model": "language model"}


def _count(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M" if count >= 1e6 else f"{count:,}"


def describe_parts(inventory) -> list[str]:
    """'vision tower model.visual (Qwen2_5_VisionTransformerPretrainedModel, 2.83B)' for each part, in PARTS order."""
    return [f"{NAMES[part]} {', '.join(info['paths']) or '(none)'} ({info['module'] or '-'}, "
            f"{_count(info['params'])})" for part in PARTS if (info := inventory.parts.get(part))]


def vision_notes(s: Setup) -> list[str]:
    """What the plan says about an image-text model's parts; [] for a causal LM."""
    inventory = s.model.inventory
    if inventory is None or not inventory.parts:
        return []
    frozen = [NAMES[part] for part in PARTS if part not in s.train]
    how = "in full" if s.kind == "full" else "with LoRA adapters"
    text = (f"image-text model ({inventory.architecture}, built by {inventory.auto_class}): "
            f"{'; '.join(describe_parts(inventory))}. Trains {how}: {', '.join(NAMES[p] for p in s.train)}")
    if frozen:
        text += (f"; the {' and the '.join(frozen)} {'is' if len(frozen) == 1 else 'are'} loaded with the model and "
                 "frozen (weights counted; no gradients or optimizer states)")
    if LANGUAGE_MODEL in s.train and len(s.train) == 1:
        text += "; text-only rows never run the vision tower (no activations)"
    return [text + "."]


def vision_unmodelled(s: Setup) -> list[str]:
    """The image-text parts no planner term covers in this recipe: a trained vision tower or projector (their
    activations, and the image tokens they add to the language model's sequence)."""
    inventory = s.model.inventory
    if inventory is None or not inventory.parts:
        return []
    trained = [part for part in s.train if part != LANGUAGE_MODEL]
    if not trained:
        return []
    return [f"the {' and '.join(NAMES[p] for p in trained)} activations and image tokens "
            f"(method.train: {', '.join(s.train)})"]


def part_summary(s: Setup) -> dict[str, dict]:
    """Per part of an image-text model: its parameters, its weights at the dtype the run holds them in (before
    quantisation and sharding), and whether ``method.train`` trains it; {} for a causal LM."""
    inventory = s.model.inventory
    if inventory is None or not inventory.parts:
        return {}
    bytes_per = s.weight_bytes if s.kind == "full" else s.held_weight_bytes
    return {part: {"params": info["params"], "weights_gib": round(info["params"] * bytes_per / GIB, 3),
                   "trains": part in s.train} for part in PARTS if (info := inventory.parts.get(part))}
