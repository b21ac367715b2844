"""Build a model's parameter inventory from its config on the meta device: the real module tree, no weights.

The only module of the catalog that imports torch, transformers and peft, and only inside its functions: planning
reaches it for a config whose inventory is neither shipped nor cached
(:func:`tuner.catalog.inventory_store.inventory_for`).
A build takes a second or a few (imports included); every count in it is what transformers and PEFT themselves make.
"""
from __future__ import annotations

import copy
import json
import math
import re
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from tuner.catalog.inventory import (LANGUAGE_MODEL, PROJECTOR, VISION_TOWER, Inventory, ModuleGroup, canonical_config,
                                     collapse, config_key)
from tuner.catalog.model_classes import CAUSAL_LM, auto_class_for
from tuner.catalog.model_config import ModelConfigError, check_resolved_config
from tuner.reason import library_words

_SIMPLE = (int, float, bool, str, type(None))
_MAX_ATTR_CHARS = 200
_PER_INSTANCE = ("layer_idx", "layer_id", "layer_index", "layer_number", "block_idx", "expert_idx")  # not structure
# A norm's epsilon under torch's name: transformers spells it per class and release (Llama4TextRMSNorm: eps in 5.24,
# variance_epsilon in 5.25), and the inventory records the structure, not the spelling
_SAME_AS = {"variance_epsilon": "eps", "epsilon": "eps"}
_LORA = re.compile(r"\.(lora_[A-Za-z_]+|base_layer)(\.|$)")


class ArchitectureError(ModelConfigError):
    """transformers cannot build the model a config describes; the message carries transformers' reason."""


@contextmanager
def _quiet():
    """transformers and PEFT warn about things that do not matter on the meta device (uninitialised weights)."""
    import warnings

    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(verbosity)


def config_object(config: dict, name: str, trust_remote_code: bool = False, code_folder: Path | None = None):
    """transformers' config class for ``config`` (its defaults filled in), or :class:`ArchitectureError`.  A trusted
    model with its own code gets its own config class, read from ``code_folder`` (the local model, or the Hugging
    Face cache's snapshot of a hub model): transformers finds a model's code by the config's ``_name_or_path``,
    which a config built from a mapping lacks (an empty repo id it refuses)."""
    from transformers import AutoConfig

    # a copy: config classes change nested settings in place (Qwen3-VL's text_config.rope_parameters), and the
    # config's content is the inventory's key
    data = copy.deepcopy({key: value for key, value in config.items()
                          if not key.startswith("_") and key != "transformers_version"})
    model_type = data.pop("model_type", None)
    if not isinstance(model_type, str) or not model_type:
        raise ArchitectureError(f"{name}: model_type: missing; transformers needs it to know which model to build.")
    folder = code_folder if trust_remote_code else None
    try:
        with _quiet():
            if folder is not None:
                return AutoConfig.from_pretrained(str(folder), trust_remote_code=True)
            return AutoConfig.for_model(model_type, trust_remote_code=trust_remote_code, **data)
    except ValueError as exc:
        if "Unrecognized model" in str(exc) or "model type" in str(exc):
            raise ArchitectureError(f"{name}: model_type {model_type!r} is not a model the installed transformers "
                                    f"knows ({_reason(exc)}); upgrade transformers, or check model_type.") from None
        raise ArchitectureError(f"{name}: transformers refuses this config: {_reason(exc)}") from None
    except Exception as exc:  # a config class's own validation (strict dataclasses raise their own types)
        raise ArchitectureError(f"{name}: transformers refuses this config: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    return library_words(exc)


def meta_model(config, trust_remote_code: bool = False):
    """The model ``config``'s auto class builds from it (a causal LM, or an image-text model: :func:`auto_class_for`,
    from transformers' own mappings), on the meta device."""
    import torch
    import transformers

    auto = getattr(transformers, auto_class_for(config.to_dict()))
    with _quiet(), torch.device("meta"):
        return auto.from_config(config, trust_remote_code=trust_remote_code)


def build_inventory(config: dict, name: str, trust_remote_code: bool = False, lora: bool = True,
                    model=None, code_folder: Path | None = None) -> Inventory:
    """Instantiate the model of ``config`` on the meta device (or take ``model``, built from it) and record its
    parameters per module path pattern; with ``lora``, also what PEFT adapts for each target (:func:`measure_lora`,
    a few more builds)."""
    import transformers

    config_obj = config_object(config, name, trust_remote_code, code_folder)
    text = _text_config(config_obj)
    check_resolved_config(text, name)
    if model is None:
        try:
            model = meta_model(config_obj, trust_remote_code)
        except Exception as exc:
            raise ArchitectureError(f"{name}: transformers cannot build {type(config_obj).__name__} "
                                    f"({getattr(config_obj, 'model_type', '?')}): {_reason(exc)}") from None
    parts = _parts(model)
    layers_path, num_layers = _decoder_layers(model, parts[LANGUAGE_MODEL]["paths"][0] if parts else "")
    groups = tuple(group for group, _ in _groups(model, layers_path))
    layer_types = getattr(text, "layer_types", None)
    inventory = Inventory(
        architecture=type(model).__name__, model_type=str(getattr(config_obj, "model_type", "")),
        transformers_version=transformers.__version__, peft_version="",
        config_sha256=config_key(config), layers_path=layers_path, num_layers=num_layers, groups=groups,
        tied=_tied(model), config=_jsonable(text.to_dict()), source_config=canonical_config(config),
        layer_types=[str(t) for t in layer_types] if isinstance(layer_types, (list, tuple)) else [],
        tp_plan={str(k): str(v) for k, v in (getattr(text, "base_model_tp_plan", None) or {}).items()},
        auto_class=auto_class_for(config_obj.to_dict()), parts=parts,
    )
    return measure_lora(inventory, name, trust_remote_code, code_folder) if lora else inventory


def measure_lora(inventory: Inventory, name: str, trust_remote_code: bool = False,
                 code_folder: Path | None = None) -> Inventory:
    """The inventory with what PEFT adapts per module group: LoRA parameters per unit of rank when target_modules
    names the group's leaf, under all-linear, and per target parameter; measured with get_peft_model on fresh
    meta models (adapters on the meta device too); and PEFT's renaming of expert names (:func:`_peft_moe_tables`).
    Only LoRA needs PEFT, so a full fine-tuning plan's build never imports it (and bitsandbytes with it)."""
    import peft

    config_obj = config_object(inventory.source_config, name, trust_remote_code, code_folder)
    model = meta_model(config_obj, trust_remote_code)
    paths = dict(_group_paths(model, inventory))
    peft_moe_mapping, peft_fused = _peft_moe_tables(model)
    lora = _lora_coefficients(config_obj, trust_remote_code, inventory.groups, peft_moe_mapping)
    groups = tuple(_with_lora(group, paths.get(index, set()), lora) for index, group in enumerate(inventory.groups))
    return replace(inventory, groups=groups, peft_version=peft.__version__, peft_moe_mapping=peft_moe_mapping,
                   peft_fused_targets=peft_fused)


def _group_paths(model, inventory: Inventory):
    """(index of the group in the inventory, the exact paths of its modules) for a model built like it."""
    keys = {_group_key(group): index for index, group in enumerate(inventory.groups)}
    for group, paths in _groups(model, inventory.layers_path):
        if _group_key(group) in keys:
            yield keys[_group_key(group)], paths


def _group_key(group: ModuleGroup) -> tuple:
    return (group.pattern, group.module, group.kind, json.dumps(group.params, sort_keys=True),
            json.dumps(group.attrs, sort_keys=True, default=str), group.quantized)


def _text_config(config_obj):
    try:
        return config_obj.get_text_config()
    except Exception:  # several text configs (encoder-decoder audio models): the top level speaks for the model
        return config_obj


def _jsonable(value):
    """``value`` with what JSON cannot hold (non-finite floats, objects) dropped."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items() if _keeps(v)}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value if _keeps(v)]
    return value


def _keeps(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (*_SIMPLE, dict, list, tuple))


def _decoder_layers(model, language_model: str = "") -> tuple[str, int]:
    """The ModuleList of the decoder layers: the one holding most parameters, inside the language model of an
    image-text model (its vision tower's blocks may hold more in a small model)."""
    import torch

    best, best_numel, count = "", -1, 0
    for path, module in model.named_modules():
        if language_model and not path.startswith(language_model + "."):
            continue
        if isinstance(module, torch.nn.ModuleList) and len(module):
            numel = sum(p.numel() for p in module.parameters())
            if numel > best_numel:
                best, best_numel, count = path, numel, len(module)
    return best, count


def unadaptable_linears(model) -> set[str]:
    """The paths of the ``nn.Linear`` modules PEFT's LoRA wrapper cannot run: those whose forward (the model code's
    own) returns other than the linear map of its input.  PEFT adds its update to what the base layer returns, so
    Llama 4's and Phi-MoE's routers (tuples) and DeepSeek-V4's grouped output projection (a reshaped map) fail at
    the first step.  Found by running each overridden forward once on the meta device (``model`` built there): a
    forward that only recomputes the map (Falcon's) stays adaptable.  The inventory marks them
    (``ModuleGroup.lora_excluded``): the planner's PEFT counts and training's LoRA config leave the same ones out."""
    import torch

    def plain_map(module) -> bool:
        try:
            out = module(torch.empty(2, module.in_features, device="meta", dtype=module.weight.dtype))
        except Exception:  # the model's own forward refuses a (rows, in_features) input
            return False
        return isinstance(out, torch.Tensor) and tuple(out.shape) == (2, module.out_features)

    return {path for path, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and type(module).forward is not torch.nn.Linear.forward
            and not plain_map(module)}


def part_paths(model) -> dict[str, list[str]]:
    """The module paths of an image-text model's vision tower, projector and language model, found as transformers
    finds them (``get_encoder(modality="image")``, ``get_decoder()``): the projector is every module outside both,
    and outside their ancestors and the output head (Gemma 3's multi_modal_projector, Idefics 3's connector), or,
    where there is none, the tower's own mergers (Qwen-VL's merger and deepstack_merger_list, which the tower runs
    last).  {} for a causal LM, and where transformers finds no tower or no decoder (planned as a causal LM is)."""
    if auto_class_for(model.config.to_dict()) == CAUSAL_LM:
        return {}
    paths = {id(module): path for path, module in model.named_modules()}
    tower, decoder = paths.get(id(model.get_encoder(modality="image"))), paths.get(id(model.get_decoder()))
    if not tower or not decoder:
        return {}
    output = model.get_output_embeddings()
    projector = []
    for path, module in model.named_modules():
        ancestor = any(_under(part, path) for part in (tower, decoder)) if path else True
        inside = any(_under(path, known) for known in [tower, decoder, *projector])
        if not ancestor and not inside and module is not output and any(True for _ in module.parameters()):
            projector.append(path)
    if not projector:
        projector = [f"{tower}.{name}" for name, _ in model.get_submodule(tower).named_children() if "merger" in name]
    return {VISION_TOWER: [tower], PROJECTOR: projector, LANGUAGE_MODEL: [decoder]}


def part_of(name: str, found: dict[str, list[str]]) -> str:
    """The part a module or parameter ``name`` belongs to: the one whose path holds it most closely (Qwen-VL's
    merger lies inside its tower), the language model for what lies in none (the output head)."""
    hits = [(len(path), part) for part, group in found.items() for path in group if _under(name, path)]
    return max(hits)[1] if hits else LANGUAGE_MODEL


def _parts(model) -> dict[str, dict]:
    """Each part of :func:`part_paths` with its module class and parameters (every parameter once: tied ones at
    their first owner); {} for a causal LM."""
    found = part_paths(model)
    if not found:
        return {}
    counts = dict.fromkeys(found, 0)
    for name, param in model.named_parameters():
        counts[part_of(name, found)] += param.numel()
    return {part: {"paths": group, "module": type(model.get_submodule(group[0])).__name__ if group else "",
                   "params": counts[part]} for part, group in found.items()}


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _layer_index(path: str, layers_path: str) -> int | None:
    prefix = layers_path + "."
    if not layers_path or not path.startswith(prefix):
        return None
    head = path[len(prefix):].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _kind(module, is_output: bool) -> str:
    import torch
    from transformers.pytorch_utils import Conv1D

    name = type(module).__name__
    own = dict(module.named_parameters(recurse=False))
    if not own:
        return "block"
    if is_output:
        return "output"
    if "Router" in name or (name.endswith("Gate") and "Linear" not in name):
        return "router"
    if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
        return "other"
    if any(p.dim() == 3 for p in own.values()) or "Expert" in name and not isinstance(module, torch.nn.Linear):
        return "experts"
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    if isinstance(module, (torch.nn.Linear, Conv1D)):
        return "linear"
    if "Norm" in name or isinstance(module, (torch.nn.LayerNorm, torch.nn.GroupNorm)):
        return "norm"
    return "other"


def _attrs(module) -> dict:
    attrs = {}
    for key, value in vars(module).items():
        if key.startswith("_") or key == "training" or key in _PER_INSTANCE or not isinstance(value, _SIMPLE):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if isinstance(value, str) and len(value) > _MAX_ATTR_CHARS:
            continue
        attrs[_SAME_AS.get(key, key)] = value
    return attrs


def _quantized_names(model) -> set[str]:
    """Modules bitsandbytes replaces, by transformers' own rule: exactly ``nn.Linear`` (or GPT-2's Conv1D), not
    among the modules it keeps (``get_keys_to_not_convert``: tied weights, the last module, the output embeddings,
    and the model's ``_keep_in_fp32_modules``)."""
    import torch
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = list(get_keys_to_not_convert(model)) + list(getattr(model, "_keep_in_fp32_modules", None) or [])
    return {name for name, module in model.named_modules()
            if (type(module) is torch.nn.Linear or isinstance(module, Conv1D)) and should_convert_module(name, skip)}


def _groups(model, layers_path: str) -> list[tuple[ModuleGroup, set[str]]]:
    """Every module with parameters, grouped by pattern, class, own shapes, attributes and quantisation; with the
    exact paths of each group's modules."""
    import torch

    owners = {id(p): name for name, p in model.named_parameters()}  # first owner of every (tied) parameter
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    quantized = _quantized_names(model)
    unadaptable = unadaptable_linears(model)
    merged: dict[tuple, dict] = {}
    for path, module in model.named_modules():
        if not path or isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)) or \
                not any(True for _ in module.parameters()):
            continue  # the root, lists, and modules without parameters (activations, rotary tables, dropout)
        own = {key: list(p.shape) for key, p in module.named_parameters(recurse=False)
               if owners.get(id(p)) == (f"{path}.{key}")}
        kind = _kind(module, module is output)
        index = _layer_index(path, layers_path)
        if kind == "block" and index is None:
            continue  # a container outside the decoder layers (the base model, a vision tower's root)
        attrs = _attrs(module)
        is_quantized = path in quantized
        key = (collapse(path), type(module).__name__, kind, json.dumps(own, sort_keys=True),
               json.dumps(attrs, sort_keys=True, default=str), is_quantized, path in unadaptable)
        entry = merged.setdefault(key, {"layers": set(), "paths": set(), "params": own, "attrs": attrs})
        entry["paths"].add(path)
        if index is not None:
            entry["layers"].add(index)
    return [(ModuleGroup(pattern=pattern, module=cls, kind=kind, params=entry["params"],
                         layers=sorted(entry["layers"]), instances=len(entry["paths"]), attrs=entry["attrs"],
                         quantized=is_quantized, lora_excluded=excluded), entry["paths"])
            for (pattern, cls, kind, _, _, is_quantized, excluded), entry in merged.items()]


def _tied(model) -> dict[str, str]:
    owners: dict[int, str] = {}
    tied = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in owners:
            tied[name] = owners[id(param)]
        else:
            owners[id(param)] = name
    return tied


def _peft_moe_tables(model) -> tuple[dict[str, str], dict[str, list[str]]]:
    """PEFT's renaming of transformers v4 expert names (gate_proj, w1, ...) to the fused v5 parameters, for this
    model type (``peft.utils.transformers_weight_conversion``); empty where PEFT renames nothing."""
    try:
        from peft.utils.transformers_weight_conversion import (_MODEL_TO_CONVERSION_PATTERN, _MOE_FUSED_TARGETS,
                                                               _MOE_TARGET_MODULE_MAPPING)
    except ImportError:
        return {}, {}
    base = _MODEL_TO_CONVERSION_PATTERN.get(getattr(model.config, "model_type", None))
    if base is None or not _MOE_FUSED_TARGETS.get(base):
        return {}, {}
    return (dict(_MOE_TARGET_MODULE_MAPPING.get(base, {})),
            {key: list(value) for key, value in _MOE_FUSED_TARGETS.get(base, {}).items()})


def _adapter_params(config_obj, trust_remote_code: bool, **lora) -> dict[str, int] | str:
    """LoRA parameters (rank 1) PEFT adds per module path for one LoraConfig, on a fresh meta model; PEFT's
    refusal as text when it refuses."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = meta_model(config_obj, trust_remote_code)
    excluded = sorted(unadaptable_linears(model)) or None
    try:
        with _quiet(), torch.device("meta"):  # the adapters too: nothing is allocated or initialised
            wrapped = get_peft_model(model, LoraConfig(r=1, lora_alpha=1, task_type="CAUSAL_LM",
                                                       exclude_modules=excluded, **lora))
    except Exception as exc:  # PEFT's words for a target it cannot adapt
        return _reason(exc)
    counts: dict[str, int] = {}
    for name, param in wrapped.named_parameters():
        if not param.requires_grad or "lora_" not in name:
            continue
        path = name.removeprefix("base_model.model.")
        path = path[:_LORA.search(path).start()]
        counts[path] = counts.get(path, 0) + param.numel()
    return counts


def _lora_coefficients(config_obj, trust_remote_code, groups, moe_mapping) -> dict:
    """Per module path, LoRA parameters per unit of rank when a recipe names it: by leaf name, under all-linear,
    and per target parameter."""
    import torch
    from transformers.pytorch_utils import Conv1D

    adaptable = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, Conv1D)
    model = meta_model(config_obj, trust_remote_code)
    leaves = sorted({path.rsplit(".", 1)[-1] for path, module in model.named_modules()
                     if path and isinstance(module, adaptable)} - set(moe_mapping))
    by_name = _adapter_params(config_obj, trust_remote_code, target_modules=leaves) if leaves else {}
    if isinstance(by_name, str):  # one of them is refused: measure them one by one
        by_name = {}
        for leaf in leaves:
            counts = _adapter_params(config_obj, trust_remote_code, target_modules=[leaf])
            by_name.update(counts if isinstance(counts, dict) else {})
    all_linear = _adapter_params(config_obj, trust_remote_code, target_modules="all-linear")
    parameters: dict[str, dict[str, int]] = {}
    targets = set(moe_mapping.values()) | {name for group in groups if group.kind == "experts" for name in group.params}
    for target in sorted(targets):
        counts = _adapter_params(config_obj, trust_remote_code, target_modules=[], target_parameters=[target])
        if isinstance(counts, dict):
            parameters[target] = counts
    return {"by_name": by_name, "all_linear": all_linear if isinstance(all_linear, dict) else {},
            "parameters": parameters}


def _with_lora(group: ModuleGroup, paths: set[str], lora: dict) -> ModuleGroup:
    from dataclasses import replace

    def per_instance(counts: dict[str, int]) -> float:
        return sum(n for path, n in counts.items() if path in paths) / group.instances

    return replace(group, lora=per_instance(lora["by_name"]) or None, lora_all_linear=per_instance(lora["all_linear"]),
                   lora_parameters={target: value for target, counts in lora["parameters"].items()
                                    if (value := per_instance(counts))})
