"""What of an image-text model trains: the parts ``method.train`` names (vision tower, projector, language model),
as the plan counts them (:mod:`tuner.planner.vision`).  Full fine-tuning freezes every other part's parameters, so
the optimizer holds states for the named parts only; LoRA's targets are looked for inside the named parts only
(PEFT's ``exclude_modules`` lists every module of the others).  A causal LM trains whole, as before."""
from __future__ import annotations

from tuner.catalog.meta_inventory import part_of, part_paths
from tuner.recipe.schema import Recipe


def freeze_untrained_parts(model, recipe: Recipe) -> list[str]:
    """Full fine-tuning: ``requires_grad`` off for every parameter of a part ``method.train`` leaves out; returns
    the parts frozen ([] for a causal LM)."""
    found = part_paths(model)
    frozen = set()
    for name, parameter in model.named_parameters() if found else ():
        if (part := part_of(name, found)) not in recipe.method.train:
            parameter.requires_grad_(False)
            frozen.add(part)
    return sorted(frozen)


def untrained_modules(model, recipe: Recipe) -> list[str] | None:
    """LoRA: the name of every module in a part ``method.train`` leaves out, for PEFT's ``exclude_modules`` (an
    exact name never matches a module of a trained part); None for a causal LM."""
    found = part_paths(model)
    if not found:
        return None
    return [name for name, _ in model.named_modules() if name and part_of(name, found) not in recipe.method.train]
