"""Tensor-parallel inference: ``tuner infer/chat --tp N`` splits every layer over N ranks on one machine with
transformers' tensor-parallel plan (``DistributedConfig(tp_size=N)``), where device_map="auto" places whole layers
one device after another. The ranks run as :mod:`tuner.infer.ranks` launches them; here is what ``--tp`` refuses
before any of them starts."""
from __future__ import annotations

from tuner.infer.load import planner_facts
from tuner.infer.ranks import check_rank_count, check_split_loading
from tuner.infer.target import InferenceTarget
from tuner.loading.model import ModelLoadError


def check_tensor_parallel(target: InferenceTarget, tp: int, *, bits: int | None = None, device_map_options=(),
                          gpus: int | None = None, cpus: int | None = None) -> None:
    """Refuse, before any rank starts, what ``--tp`` cannot run; ``device_map_options`` are the device_map
    flags given (``--max-memory``); ``gpus``/``cpus`` default to this machine's."""
    flag = f"--tp {tp}"
    if bits or target.recipe.method.quantization is not None:
        given = f"--bits {bits}" if bits else f"method.quantization ({target.recipe.method.kind})"
        raise ModelLoadError(f"{flag} cannot load {given}: transformers' tensor-parallel plan splits 16/32-bit "
                             f"weights, not bitsandbytes' 4/8-bit ones; load the model unquantised (or drop --tp "
                             "to place the model with device_map=\"auto\").")
    check_split_loading(target, flag, "every tensor-parallel rank holds a slice of every layer", device_map_options)
    _check_split(target, tp)
    check_rank_count(flag, tp, gpus, cpus)


def _check_split(target: InferenceTarget, tp: int) -> None:
    """The model has a tensor-parallel plan, and tp divides what it splits (the recipe check's rule)."""
    from transformers import AutoConfig

    from tuner.recipe.checks import tp_uneven

    facts, name = planner_facts(target), target.recipe.model.id
    if facts is not None:
        uneven, fitting = tp_uneven(facts, tp)
        if uneven:
            advice = f"use --tp {' or '.join(map(str, fitting))}" if fitting else "this model cannot be split"
            raise ModelLoadError(f"--tp {tp} must divide {name}'s {', '.join(uneven)}: {advice}, or drop --tp to "
                                 "place the model with device_map=\"auto\".")
    model = target.recipe.model
    try:
        config = AutoConfig.from_pretrained(target.model_path, revision=model.revision,
                                            trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError):
        return  # loading says why, on every rank
    if not getattr(config, "base_model_tp_plan", None):
        raise ModelLoadError(f"--tp: transformers has no tensor-parallel plan for {name} (model type "
                             f"{config.model_type}); drop --tp to place it with device_map=\"auto\".")
