"""A model's config.json, read and checked before anything is built from it.

A damaged or hostile file (a list where a mapping belongs, 0 heads, a 10^9-wide hidden layer, ``1e400``, nesting a
thousand levels deep, more experts per token than experts) is refused here naming the file and the key, so no
traceback, no runaway build and no negative parameter count can follow.  Pure Python: ``tuner validate`` and
``tuner plan`` check a config without torch.  The checks see the config as transformers' loader decodes it
(:func:`decoded`), so a config transformers saved is read as transformers reads it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

MAX_CONFIG_BYTES = 4 * 2**20  # a config.json is a few KiB
MAX_DEPTH = 24  # the deepest real configs (multimodal, nested rope and quantisation settings) are under 8 levels
SUB_CONFIGS = ("text_config", "language_config", "llm_config")  # where a multimodal config keeps its language model

# key: (smallest, largest) for a size the module tree is built from; None (absent) is always allowed
SIZES = {
    "hidden_size": (1, 2**17), "n_embd": (1, 2**17), "d_model": (1, 2**17),
    "num_hidden_layers": (1, 2048), "n_layer": (1, 2048), "num_layers": (1, 2048),
    "num_attention_heads": (1, 2**12), "n_head": (1, 2**12), "num_key_value_heads": (1, 2**12),
    "head_dim": (1, 2**12), "intermediate_size": (1, 2**20), "ffn_dim": (1, 2**20), "n_inner": (1, 2**20),
    "moe_intermediate_size": (1, 2**20), "shared_expert_intermediate_size": (0, 2**20),
    "vocab_size": (1, 2**24), "max_position_embeddings": (1, 2**27),
    "num_experts": (0, 2**14), "num_local_experts": (0, 2**14), "n_routed_experts": (0, 2**14),
    "n_shared_experts": (0, 2**10), "num_experts_per_tok": (1, 2**14), "moe_topk": (1, 2**14),
    "kv_lora_rank": (1, 2**14), "q_lora_rank": (1, 2**14), "qk_rope_head_dim": (1, 2**12),
    "qk_nope_head_dim": (1, 2**12), "v_head_dim": (1, 2**12), "sliding_window": (0, 2**27),
    "linear_num_key_heads": (1, 2**12), "linear_num_value_heads": (1, 2**12), "linear_key_head_dim": (1, 2**12),
    "linear_value_head_dim": (1, 2**12), "linear_conv_kernel_dim": (1, 2**10), "first_k_dense_replace": (0, 2048),
}
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


class UnknownModelError(ValueError):
    """No architecture facts for a model id; the message says where tuner looked, ``field`` which recipe field named
    the model (``model.id``, or the teacher's, a reward model's: :func:`tuner.catalog.models.model_named_at`)."""

    def __init__(self, message: str, field: str = "model.id"):
        super().__init__(message)
        self.field = field


class ModelConfigError(ValueError):
    """A model's config cannot be planned from: the message names the file, the key and what is wrong."""


def read_config(path: Path) -> dict:
    """config.json at ``path`` as a checked mapping, or :class:`ModelConfigError` naming the file."""
    from tuner.fileio import NotARegularFile, TooLarge, read_limited

    try:
        text = read_limited(path, MAX_CONFIG_BYTES, pipes=False).decode("utf-8")
        config = decoded(json.loads(text))
    except TooLarge:
        raise ModelConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; a config.json is a few KiB: "
                               "point model.id at the folder save_pretrained wrote.") from None
    except NotARegularFile as exc:
        raise ModelConfigError(f"{path}: {exc.kind}, not a file.") from None
    except RecursionError:
        raise ModelConfigError(f"{path}: nested too deeply to read (more than {MAX_DEPTH} levels).") from None
    except UnicodeDecodeError:
        raise ModelConfigError(f"{path}: not UTF-8 text; a config.json is JSON.") from None
    except ValueError as exc:
        raise ModelConfigError(f"{path}: not valid JSON ({exc}).") from None
    except OSError as exc:
        raise ModelConfigError(f"{path}: cannot be read ({exc.strerror or exc}).") from None
    check_config(config, str(path))
    return config


def decoded(config):
    """``config`` as transformers' own loader (``PreTrainedConfig._dict_from_json_file``) decodes it: transformers 5
    saves a non-finite float as ``{"__float__": "Infinity"}`` (Mamba-2's ``time_step_limit``) and turns it back into
    ``inf`` on load, so tuner decodes with transformers' function rather than a second copy of it.  Only a config
    that holds such a tag imports transformers (a second or more, torch with it): the decoding leaves any other
    mapping as it is, and a plan from a cached inventory imports neither."""
    if not _tagged(config):
        return config
    from transformers.configuration_utils import PreTrainedConfig

    return PreTrainedConfig._decode_special_floats(config)


def _tagged(value) -> bool:
    """Whether any mapping in ``value`` holds the key transformers tags a non-finite float with."""
    if isinstance(value, dict):
        return "__float__" in value or any(_tagged(item) for item in value.values())
    return isinstance(value, list) and any(_tagged(item) for item in value)


def _describe(value) -> str:
    if value is None:
        return "null"
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)


def check_config(config, where: str) -> None:
    """Refuse what no model can be built from, naming ``where`` (the file) and the key."""
    if not isinstance(config, dict):
        raise ModelConfigError(f"{where}: the top level is {_describe(config)}, not a mapping of settings; a "
                               "config.json holds one JSON object ({\"model_type\": ..., \"hidden_size\": ...}).")
    _check_values(config, where, "", 1)
    _check_sizes(config, where, "")
    for sub in SUB_CONFIGS:
        if sub in config and config[sub] is not None:
            if not isinstance(config[sub], dict):
                raise ModelConfigError(f"{where}: {sub}: {_describe(config[sub])}, not a mapping; it holds the "
                                       "language model's settings ({\"hidden_size\": ...}).")
            _check_sizes(config[sub], where, f"{sub}.")


def _check_values(value, where: str, key: str, depth: int) -> None:
    """Nesting depth; sizes (SIZES) are checked by :func:`_check_sizes` (Infinity elsewhere is real: Mamba's
    time_step_limit)."""
    if depth > MAX_DEPTH:
        raise ModelConfigError(f"{where}: {key.rstrip('.') or 'the top level'}: nested more than {MAX_DEPTH} levels "
                               "deep; no model config is.")
    if isinstance(value, dict):
        for name, item in value.items():
            _check_values(item, where, f"{key}{name}.", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_values(item, where, f"{key.rstrip('.')}[{index}].", depth + 1)


def _check_sizes(config: dict, where: str, prefix: str) -> None:
    for key, (low, high) in SIZES.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, list) and value:  # one size per layer (Gemma 3n's intermediate_size)
            for index, item in enumerate(value):
                check_size(item, f"{where}: {prefix}{key}[{index}]", low, high)
            continue
        check_size(value, f"{where}: {prefix}{key}", low, high)
    experts = next((config[key] for key in EXPERT_KEYS if isinstance(config.get(key), int)), None)
    per_token = config.get("num_experts_per_tok")
    if experts and isinstance(per_token, int) and per_token > experts:
        raise ModelConfigError(f"{where}: {prefix}num_experts_per_tok: {per_token} experts per token, but the model "
                               f"has {experts}; each token is routed to at most all of them.")
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise ModelConfigError(f"{where}: {prefix}num_key_value_heads: {kv} does not divide the {heads} attention "
                               "heads; each key/value head serves the same number of query heads.")


def check_size(value, what: str, low: int, high: int) -> int:
    """``value`` as a size between ``low`` and ``high``, or :class:`ModelConfigError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        shown = "an infinite number" if isinstance(value, float) and not math.isfinite(value) else repr(value)
        raise ModelConfigError(f"{what}: {shown} is not a whole number.")
    if value < low:
        raise ModelConfigError(f"{what}: {value} is {'negative' if value < 0 else 'too small'}; it must be at least "
                               f"{low}.")
    if value > high:
        raise ModelConfigError(f"{what}: {value} is larger than any model has ({high} at most here).")
    return value


def check_resolved_config(config, name: str) -> None:
    """The same bounds on transformers' resolved config (defaults filled in, aliases such as n_layer resolved),
    before a model is built from it."""
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "num_key_value_heads",
                "intermediate_size", "head_dim"):
        try:
            value = getattr(config, key, None)
        except Exception:  # a property that computes from missing values
            value = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            low, high = SIZES[key]
            check_size(value, f"{name}: {key}", low, high)


def code_refs(config, depth: int = 4) -> set[str]:
    """The classes (``module.Class``) every ``auto_map`` of a config names, and those of the configs nested in it
    (``text_config``, ``vision_config``): a composite model's sub-model may ship the code."""
    if not isinstance(config, dict) or depth == 0:
        return set()
    found: set[str] = set()
    for value in (config["auto_map"].values() if isinstance(config.get("auto_map"), dict) else ()):
        found.update(ref for ref in (value if isinstance(value, list) else [value]) if isinstance(ref, str) and ref)
    return found.union(*(code_refs(value, depth - 1) for value in config.values()))
