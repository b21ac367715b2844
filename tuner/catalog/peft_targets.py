"""How PEFT resolves a recipe's LoRA targets on a model's module-tree inventory: which groups its target names
match (a module path equal to the name or ending in '.' + it), which fused parameters transformers v4 expert names
become, what its modules_to_save takes, by the PEFT release installed (0.21 and 0.22 differ); the facts' LoRA
counts and the recipe checks read them from here."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from tuner.catalog.inventory import Inventory, ModuleGroup


@dataclass(frozen=True)
class PeftTargets:
    """What PEFT adapts for a recipe's target_modules and target_parameters, resolved as PEFT resolves them:
    transformers v4 expert names (gate_proj, up_proj, down_proj, gate) become the fused v5 parameters they live in
    (``peft.utils.transformers_weight_conversion``), a fused pair at twice the rank."""

    modules: tuple[str, ...] | str  # names matched against module paths, or "all-linear"
    parameters: tuple[tuple[str, int], ...]  # (parameter name or suffix, rank factor)
    refusal: str | None = None  # PEFT's reason when it refuses the combination


def peft_targets(inventory: Inventory, target_modules, target_parameters: tuple[str, ...] = ()) -> PeftTargets:
    """PEFT's resolution of a recipe's targets (``_convert_peft_config_moe``): v4 expert names become target
    parameters; a fused pair named in part is refused as PEFT refuses it."""
    mapping, fused = inventory.peft_moe_mapping, inventory.peft_fused_targets
    if target_modules == "all-linear" or not mapping:
        return PeftTargets(target_modules if target_modules == "all-linear" else tuple(target_modules),
                           tuple((name, 1) for name in target_parameters))
    modules, parameters, named = [], {name: 1 for name in target_parameters}, {}
    keeps_linears = _peft_keeps_linear_targets(inventory)
    for target in target_modules:
        old = next((old for old in mapping if target == old or target.endswith(f".{old}")), None)
        if old is None:
            modules.append(target)
            continue
        matching = [group for group in inventory.groups if _module_matches(group, target)]
        if keeps_linears and matching and all(group.kind == "linear" for group in matching):
            modules.append(target)  # DeepSeek-V3's dense and shared-expert down_proj stay module targets
            if not any(group.kind != "linear" and any(_named(f"{group.pattern}.{name}", mapping[old])
                                                      for name in group.params) for group in inventory.groups):
                continue
        parameters.setdefault(mapping[old], 1)
        named.setdefault(mapping[old], set()).add(old)
    for new, required in fused.items():
        present = named.get(new, set())
        if 0 < len(present) < len(required):
            missing = ", ".join(sorted(set(required) - present))
            return PeftTargets(tuple(modules), tuple(parameters.items()),
                               f"PEFT cannot adapt {', '.join(sorted(present))} without also targeting {missing}: "
                               f"transformers fuses them into {new}")
        if len(present) == len(required) > 1:
            parameters[new] = len(required)
    return PeftTargets(tuple(modules), tuple(parameters.items()))


def peft_release(measured_with: str = "") -> tuple[int, ...]:
    """The PEFT release that will train (the installed one, else ``measured_with``: an inventory's), as numbers:
    its rules for targets and modules_to_save changed in 0.22."""
    release = _installed_peft() or measured_with
    return tuple(int(part) for part in re.findall(r"\d+", release)[:2])


@lru_cache(maxsize=1)
def _installed_peft() -> str:
    """The installed PEFT's version, read once (a plan asks per module group)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("peft")
    except PackageNotFoundError:
        return ""


def peft_saves(path: str, name: str) -> bool:
    """Whether PEFT's modules_to_save ``name`` takes the module at ``path``: a plain suffix before 0.22 (``norm``
    takes ``q_norm`` and ``input_layernorm``), a whole trailing module name from 0.22 (``_is_valid_match``)."""
    return path.endswith(name) if peft_release() < (0, 22) else _named(path, name)


def _peft_keeps_linear_targets(inventory: Inventory) -> bool:
    """PEFT from 0.22 keeps a v4 expert name as a module target where it names nn.Linear modules, and adds the fused
    parameter only where one of that name lies outside them (peft #3711, #3945); 0.21 turned it into the parameter
    alone."""
    return peft_release(inventory.peft_version) >= (0, 22)


def _named(path: str, target: str) -> bool:
    return path == target or path.endswith("." + target)


def _module_matches(group: ModuleGroup, target: str) -> bool:
    """PEFT's rule for a target module name: the module's path equals it or ends with '.' + it."""
    if not any(ch.isdigit() for ch in target):
        return _named(group.pattern, target)
    return any(_named(name, target) for name in group.names())


def adapted_groups(inventory: Inventory, targets: PeftTargets, with_names: bool = False):
    """(group, LoRA parameters per unit of rank over all its instances[, parameter name]) for every adapted group."""
    found = []
    for group in inventory.groups:
        if targets.modules == "all-linear":
            if group.lora_all_linear:
                found.append((group, group.lora_all_linear * group.instances, ""))
        elif (per_instance := group.lora or _kept_linear(group)) and \
                any(_module_matches(group, target) for target in targets.modules):
            matched = group.instances
            if any(ch.isdigit() for target in targets.modules for ch in target):
                matched = sum(1 for name in group.names() if any(_named(name, t) for t in targets.modules)) \
                    or group.instances
            found.append((group, per_instance * matched, ""))
        for name, per_rank in group.lora_parameters.items():
            if targets.modules == "all-linear" and group.lora_all_linear:
                continue  # all-linear already adapts the experts (PEFT renames them into target parameters)
            full = f"{group.pattern}.{name}"
            factor = max((factor for target, factor in targets.parameters
                          if full == target or full.endswith("." + target)), default=0)
            if factor:
                found.append((group, per_rank * factor * group.instances, name))
    if with_names:
        return found
    return [(group, per_rank) for group, per_rank, _ in found]


def _kept_linear(group: ModuleGroup) -> float:
    """LoRA parameters per unit of rank of an nn.Linear the inventory measured no count for by name: one whose leaf
    PEFT 0.21 renamed into a fused parameter, which PEFT 0.22 keeps as a module target (r x (in + out))."""
    if group.kind != "linear" or group.lora_excluded:
        return 0.0
    return float(group.attrs.get("in_features", 0) + group.attrs.get("out_features", 0))
