"""The parts of an image-text model in a plan: its vision tower, projector and language model (from the module
tree, :attr:`tuner.catalog.inventory.Inventory.parts`), which of them train (``method.train``), and what tuner
cannot yet judge about them.

A fine-tune of an image-text checkpoint loads the whole model (transformers' image-text class builds the tower
with it) and trains the parts ``method.train`` names; the others are frozen: their weights are counted, they get no
gradients or optimizer states.  Text rows never run the tower; rows with images run a frozen tower whose forward
:mod:`tuner.planner.tower` plans, for the tower kinds it models (others get no verdict).  A trained tower or
projector keeps tensors for the backward, planned by :mod:`tuner.planner.tower_backward` for the same kinds; a
trained one of another kind gets no verdict rather than a "fits".
"""
from __future__ import annotations

from tuner.catalog.inventory import LANGUAGE_MODEL, PARTS
from tuner.planner.items import GIB, STEP_MOMENTS, TOWER, Item
from tuner.planner.rank_setup import Setup
from tuner.planner.tower import tower_bytes
from tuner.planner.tower_backward import modelled, trains_tower_parts

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
    if not s.images:
        text += "; text-only rows never run the vision tower (no activations)"
    elif s.tower is not None:
        frozen_tower = "vision_tower" not in s.train
        text += (f"; each row's image (planned as one a row) runs the {'frozen' if frozen_tower else 'trained'} "
                 f"{s.tower.describe()} in the language model's sequence, inside max_seq_length ({s.seq}: TRL's "
                 "collator cuts input_ids after the processor expands the image placeholder)")
        if frozen_tower:
            text += ("; the tower saves nothing for backward (nothing in it requires grad), its forward holds the "
                     "pixel values, its input and one encoder layer")
        elif modelled(s):
            text += ("; the trained tower keeps its encoder layers' activations (or, checkpointed, their inputs) for "
                     "its backward, the step's last (vision tower backward)")
    notes = [text + "."]
    if s.tower is not None and s.tower.sequence_tokens > s.seq:
        notes.append(f"max_seq_length {s.seq} is shorter than the {s.tower.sequence_tokens} image tokens of one "
                     "image: the collator cuts them and the model refuses the batch (image features and image tokens "
                     "do not match); raise training.max_seq_length.")
    return notes


def tower_items(s: Setup) -> list[Item]:
    """The frozen tower's forward over one micro-batch's images (one a row), and the pixel values the batch
    holds through the step; [] without image data or a modelled tower."""
    if s.tower is None:
        return []
    held = tower_bytes(s.tower, s.batch, s.act_bytes, s.eager)
    return [Item(f"vision tower: pixel values ({s.batch} images)", "activations", held.pop("pixel values"),
                 STEP_MOMENTS, source="vision-tower")] + \
        [Item(f"vision tower: {name} ({s.batch} x {s.tower.patches} patches)", "activations", size, TOWER,
              source="vision-tower") for name, size in held.items()]


def vision_unmodelled(s: Setup) -> list[str]:
    """The image-text parts no planner term covers in this recipe: a tower of a kind not modelled running on the
    data's images, and then, trained, its saved activations (a modelled kind's: :mod:`tuner.planner.tower_backward`)."""
    inventory = s.model.inventory
    if inventory is None or not inventory.parts:
        return []
    trained = [part for part in s.train if part != LANGUAGE_MODEL]
    unmodelled = []
    if trains_tower_parts(s) and not modelled(s):
        unmodelled.append(f"the {' and '.join(NAMES[p] for p in trained)} activations saved for backward "
                          f"(method.train: {', '.join(s.train)})")
    if s.images and s.tower is None:
        tower = inventory.parts.get("vision_tower", {}).get("module") or "its tower"
        unmodelled.append(f"the image tokens and the forward of {inventory.model_type}'s vision tower ({tower}) on "
                          "the data's images (modelled: LLaVA's CLIP/SigLIP, Gemma 3's SigLIP, Qwen2-VL's, "
                          "Qwen2.5-VL's, Qwen3-VL's, Llama 4's, Idefics 3's and SmolVLM's)")
    return unmodelled


def part_summary(s: Setup) -> dict[str, dict]:
    """Per part of an image-text model: its parameters, its weights at the dtype the run holds them in (before
    quantisation and sharding), and whether ``method.train`` trains it; {} for a causal LM."""
    inventory = s.model.inventory
    if inventory is None or not inventory.parts:
        return {}
    bytes_per = s.weight_bytes if s.kind == "full" else s.held_weight_bytes
    return {part: {"params": info["params"], "weights_gib": round(info["params"] * bytes_per / GIB, 3),
                   "trains": part in s.train} for part in PARTS if (info := inventory.parts.get(part))}
