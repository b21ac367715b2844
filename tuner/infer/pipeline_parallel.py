"""Pipeline-parallel inference: ``tuner infer/chat --pp N`` gives each of N ranks on one machine a run of whole
decoder layers (transformers' ``DistributedConfig(pp_size=N)``, ``distributed/pipeline_parallel.py``): rank 0 embeds
the tokens and runs the first layers, sends the hidden states on, and the last rank's logits are broadcast back to
every rank so that ``generate`` runs unchanged on each. The ranks run as :mod:`tuner.infer.ranks` launches them;
here is what ``--pp`` refuses before any of them starts."""
from __future__ import annotations

from tuner.infer.ranks import check_rank_count, check_split_loading
from tuner.infer.target import InferenceTarget
from tuner.loading.model import ModelLoadError

DROP = "drop --pp to place the model with device_map=\"auto\""


def check_pipeline_parallel(target: InferenceTarget, pp: int, *, tp: int = 1, bits: int | None = None,
                            images=(), device_map_options=(), gpus: int | None = None,
                            cpus: int | None = None) -> None:
    """Refuse, before any rank starts, what ``--pp`` cannot run (``images``: the ``--image`` files given;
    ``device_map_options``, ``gpus``, ``cpus``: as for ``--tp``)."""
    flag = f"--pp {pp}"
    if tp > 1:
        raise ModelLoadError(f"{flag} with --tp {tp}: tuner splits a model one way at a time, over whole layers "
                             f"(--pp) or within every layer (--tp); choose one.")
    if images:
        raise ModelLoadError(f"{flag} with --image: transformers' pipeline stages carry a text model's hidden states "
                             "(the first stage embeds the tokens, the others take them as inputs_embeds), and an "
                             f"image-text model's vision tower belongs to no stage; leave --image out, or {DROP}.")
    if bits or target.recipe.method.quantization is not None:
        given = f"--bits {bits}" if bits else f"method.quantization ({target.recipe.method.kind})"
        raise ModelLoadError(f"{flag} cannot load {given}: tuner has not run bitsandbytes' 4/8-bit weights through "
                             f"transformers' pipeline stages; load the model unquantised, or {DROP}.")
    check_split_loading(target, flag, "each pipeline stage holds its own layers whole", device_map_options)
    _check_stages(target, pp)
    check_rank_count(flag, pp, gpus, cpus)


def _check_stages(target: InferenceTarget, pp: int) -> None:
    """The model has the modules transformers' stages replace, and at least one layer per stage."""
    from tuner.loading.model import build_on_meta

    recipe = target.recipe.model_copy(deep=True)
    recipe.model.id, recipe.method.kind, recipe.method.quantization = str(target.model_path), "full", None
    try:
        model = build_on_meta(recipe, layers=None)
    except (OSError, ValueError):
        return  # loading says why, on every rank
    base = model.base_model_prefix
    needed = (f"{base}.embed_tokens", f"{base}.layers", f"{base}.norm", "lm_head")
    names = dict(model.named_modules())
    missing = [name for name in needed if name not in names]
    name = target.recipe.model.id
    if missing:
        raise ModelLoadError(f"--pp: transformers' pipeline stages (apply_pipeline_parallelism) replace a causal "
                             f"LM's {', '.join(needed)} with identity layers where a stage does not own them, and "
                             f"{name}'s {type(model).__name__} has no {', '.join(missing)}; {DROP}.")
    layers = len(names[f"{base}.layers"])
    if pp > layers:
        raise ModelLoadError(f"--pp {pp} splits {name}'s {layers} decoder layers into {pp} stages, so "
                             f"{pp - layers} stage(s) would hold no layer (transformers' layer_range_for_rank): use "
                             f"--pp {layers} or less, or {DROP}.")
