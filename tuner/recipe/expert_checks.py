"""Expert and pipeline parallelism (``parallelism.ep``, ``parallelism.pp``) as transformers' DistributedConfig accepts
them, checked at validate in the library's own words.

What trains and what only infers, from transformers 5.24's ``distributed`` package:

- ep trains: ``from_pretrained(distributed_config=DistributedConfig(ep_size, fsdp_size))`` gives each rank
  ``num_experts / ep`` whole experts (``grouped_gemm`` shards dim 0) and routes tokens to them with an autograd-aware
  all-to-all (``ep_dispatch_experts``); FSDP2 shards the dense part over ``fsdp_size``. The Trainer leaves such a
  model to itself (``is_distributed_loading_by_transformers``), and tp 1 asks Accelerate for no ParallelismConfig,
  so it runs on gloo CPU ranks too.
- pp only infers: ``pipeline_parallel_naive_forward`` sends hidden states forward and broadcasts the last stage's
  logits for ``generate``; there is no backward schedule, and the library refuses FSDP with it. ``tuner infer/chat
  --pp N`` runs it (:mod:`tuner.infer.pipeline_parallel`).
"""
from __future__ import annotations

from tuner.recipe.problem import Problem
from tuner.recipe.schema import Recipe

# what torch raised when PEFT's expert adapter (ParamWrapper, target_parameters) ran over EP-sharded experts: its
# LoRA weights stay plain tensors beside the experts' DTensors (seen on two gloo ranks, peft 0.18, torch 2.10)
PEFT_EP_ERROR = ("aten.baddbmm.default got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor "
                 "before calling distributed operators!")


def _transformers_here() -> bool:
    """A core-only install (no transformers) validates too: the library's own checks then run where it trains, at
    load, in the same words."""
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


def library_config_error(ep: int, tp: int, fsdp: int, dp_replicate: int, pp: int = 1) -> str | None:
    """What transformers' DistributedConfig says of these sizes (its own message), or None when it accepts them
    (or is not installed here)."""
    if not _transformers_here():
        return None
    from transformers.distributed import DistributedConfig

    try:
        DistributedConfig(tp_size=tp, fsdp_size=fsdp, dp_replicate_size=dp_replicate, ep_size=ep, pp_size=pp)
    except ValueError as exc:
        return str(exc)
    return None


def model_ep_plan(model_type: str) -> dict[str, str] | None:
    """The model config class's ``base_model_ep_plan`` (None when transformers knows no such config class)."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return None
    return dict(getattr(CONFIG_MAPPING[model_type], "base_model_ep_plan", None) or {})


def _model_problems(recipe: Recipe) -> list[Problem]:
    """The model's side: an ep plan with token dispatch (ep > tp always needs one), experts that divide by ep."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    par, model = recipe.parallelism, recipe.model
    try:
        facts = model_facts(model.id, model.revision, model.trust_remote_code)
    except UnknownModelError:
        return []  # the plan says the model is unknown
    if not _transformers_here():
        return []
    plan = model_ep_plan(facts.model_type)
    if not plan:
        return [Problem("parallelism.ep", (
            f"`ep_size={par.ep}` was requested, but {model.id} ({facts.model_type}) has no `ep_plan` (transformers' "
            f"words: add `base_model_ep_plan` to the model's config, or set `ep_size=1`): set ep: 1 for this model, "
            "or use a MoE model whose transformers config has a base_model_ep_plan."), anchor="parallelism")]
    if par.ep > par.tp and "ep_dispatch_experts" not in plan.values():
        return [Problem("parallelism.ep", (
            f"`ep_size > tp_size` needs an `\"ep_dispatch_experts\"` rule (transformers), which {facts.model_type}'s "
            f"base_model_ep_plan lacks: set ep equal to tp ({par.tp}), or ep: 1."), anchor="parallelism")]
    if facts.num_experts % par.ep:
        fitting = [size for size in range(2, facts.num_experts + 1) if facts.num_experts % size == 0][:6]
        return [Problem("parallelism.ep", (
            f"Cannot evenly shard {facts.num_experts} experts across {par.ep} expert-parallel ranks (transformers): "
            f"use ep {' or '.join(map(str, fitting))}, or ep: 1."), anchor="parallelism")]
    return []


def expert_pipeline_problems(recipe: Recipe) -> list[Problem]:
    """ep's and pp's rules: the backend, the mesh sizes as DistributedConfig checks them, the model's plan, what
    adapters and objectives tuner trains under ep."""
    par, mem = recipe.parallelism, recipe.memory
    problems = []
    if par.pp > 1:
        problems.append(Problem("parallelism.pp", (
            "transformers' pipeline stages run forward only (pipeline_parallel_naive_forward broadcasts the last "
            "stage's logits for generate; it has no backward schedule, and \"Combining FSDP with pipeline "
            "parallelism is not supported yet\"): training cannot use them; for inference give tuner infer or chat "
            "--pp N on the command line (a recipe is checked alike to train and to answer): set pp: 1."),
            anchor="parallelism"))
    if par.ep == 1:
        return problems
    if mem.distributed != "fsdp":
        problems.append(Problem("parallelism.ep", (
            f"expert parallelism is transformers' DistributedConfig (ep_size with FSDP2 over dp_shard), which tuner "
            f"runs under distributed: fsdp; {mem.distributed} has no expert sharding: set distributed: fsdp, or "
            "ep: 1."), anchor="parallelism"))
        return problems
    if par.cp > 1:
        problems.append(Problem("parallelism.cp", (
            "with ep, transformers shards the model while loading it (DistributedConfig), whose mesh has no cp "
            "dimension: use ep or cp."), anchor="parallelism"))
        return problems
    if not recipe.uses_gpu and par.tp > 1:
        problems.append(Problem("parallelism.tp", (
            "with ep and tp > 1 the Trainer hands Accelerate a ParallelismConfig, which Accelerate refuses on CPU "
            "ranks: set tp: 1 (ep alone runs on the CPU), or use GPUs."), anchor="parallelism"))
    said = library_config_error(par.ep, par.tp, par.dp_shard, par.dp_replicate)
    if said:
        problems.append(Problem("parallelism.ep", (
            f"transformers' DistributedConfig(ep_size={par.ep}, tp_size={par.tp}, fsdp_size={par.dp_shard}) says: "
            f"{said} Make ep a multiple of tp that divides dp_shard x tp ({par.dp_shard * par.tp}), or ep: 1."),
            anchor="parallelism"))
    if recipe.method.kind != "full":
        problems.append(Problem("method.kind", (
            f"under ep, PEFT's expert adapters fail in torch's words: \"{PEFT_EP_ERROR}\" (the adapter's weights stay "
            "plain tensors beside the experts' sharded ones), and adapters on the other layers are not tested under "
            "ep here: set method.kind: full, or ep: 1 for lora."), anchor="parallelism.ep"))
    if recipe.objective.kind != "sft":
        problems.append(Problem("parallelism.ep", (
            f"tuner trains with ep under the sft objective only (its checkpoints resume through the Trainer tuner "
            f"builds for a model sharded at load; {recipe.objective.kind} builds TRL's): set objective.kind: sft, "
            "or ep: 1."), anchor="parallelism"))
    return problems + (_model_problems(recipe) if not said else [])
