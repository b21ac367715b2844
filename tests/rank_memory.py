"""One training step per rank under torch's MemTracker, for tests/test_rank_memory.py (run by torchrun on gloo).

    python -m torch.distributed.run --nproc_per_node N tests/rank_memory.py OUT_DIR MODEL_DIR ENGINE:PRECISION...

ENGINE: zero1, zero2, zero3 (DeepSpeed, given a torch AdamW as the Trainer gives it), autotp1 (DeepSpeed AutoTP over
every rank, ZeRO-1: the model split by ``deepspeed.tp_model_init`` as the Trainer splits it), fsdp2 (torch's
``fully_shard`` on every decoder layer and the root, as Accelerate's FSDP2 plugin wraps a model), ep2 (MODEL_DIR's saved
MoE loaded with transformers' DistributedConfig(ep_size, fsdp_size) over every rank, as ``tuner run demo-moe-ep``
loads it), or grpo-ddp and
grpo-zero2 (one GRPO round of :data:`GRPO` under torch's DDP or DeepSpeed ZeRO-2, with a frozen reference: its
generation and its training step, each with its own peak); ``-lora`` after a DeepSpeed engine (zero3-lora) wraps the
model first with the LoRA of the built-in recipe :data:`LORA_RECIPE` (PEFT, the Trainer's optimizer over the trainable
parameters only); PRECISION: fp32, or
bf16 (DeepSpeed's bf16 engine with fp32 master partitions; FSDP2's bf16 MixedPrecisionPolicy over fp32 parameters, as
Accelerate sets it up). The model is built from MODEL_DIR/config.json in float32, a warm-up step creates the
optimizer states, and the second step runs inside ``MemTracker`` (see :func:`trace` for what it is told to track).  Each rank writes OUT_DIR/rank<R>.json, for each
ENGINE:PRECISION:

- ``peak``: MemTracker's peak snapshot of the step, bytes by category (Parameter, Gradient, Optstate, Activation,
  Temp, Other) and Total;
- ``persistent``: the tensors alive after the step (model states: what the next step starts from).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SEQ, BATCH = 32, 1
# the GRPO round the grpo-* engines trace: micro-batch, its objective section (the test plans the same)
GRPO_BATCH = 2
GRPO = {"kind": "grpo", "beta": 0.04, "grpo": {"num_generations": 2, "max_prompt_length": 16,
                                               "max_completion_length": 16, "steps_per_generation": 2,
                                               "rewards": [{"kind": "exact_match", "column": "answer"}]}}
LORA_RECIPE = "demo-moe-lora"  # the -lora engines' adapters: its method.lora (LoRA on the fused experts)


def traced_recipe(model_dir, run: str, ranks: int):
    """The recipe whose plan a traced ENGINE:PRECISION run is held to (schema only: the recipe checks refuse FSDP on
    the CPU, where Accelerate would fall back to DDP, which the worker sidesteps by calling fully_shard itself)."""
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_path
    from tuner.recipe.schema import Recipe

    engine, precision = run.split(":")
    lora = engine.endswith("-lora")
    engine = engine.removesuffix("-lora")
    memory = {"distributed": "fsdp"} if engine == "fsdp2" else {"distributed": "deepspeed", "zero_stage": int(engine[-1])}
    method = load_recipe(builtin_path(LORA_RECIPE)).method.model_dump() if lora else {"kind": "full"}
    return Recipe.model_validate({
        "model": {"id": str(model_dir), "dtype": "float32"}, "method": method,
        "hardware": {"gpus_per_machine": 0, "num_processes": ranks},
        "memory": {**memory, "mixed_precision": precision if precision == "bf16" else "no"},
        "training": {"max_seq_length": SEQ, "micro_batch_size": BATCH},
        "data": {"eval_fraction": 0}})


def grpo_recipe(model_dir: str, engine: str, ranks: int, precision: str):
    """The recipe of a traced GRPO round (schema only: the checks refuse nothing here, but need no data file)."""
    from tuner.recipe.schema import Recipe

    memory = {"distributed": "ddp"} if engine == "grpo-ddp" else {"distributed": "deepspeed", "zero_stage": 2}
    return Recipe.model_validate({
        "model": {"id": str(model_dir), "dtype": "float32"}, "objective": GRPO,
        "hardware": {"gpus_per_machine": 0, "num_processes": ranks},
        "memory": {**memory, "mixed_precision": precision if precision == "bf16" else "no"},
        "training": {"micro_batch_size": GRPO_BATCH, "max_seq_length": 32},
        "data": {"eval_fraction": 0, "format": "prompt"}})


def _category(key) -> str:
    return getattr(key, "value", str(key))


def _snapshot(tracker, kind: str) -> dict[str, int]:
    """Bytes by category on real devices (DeepSpeed keeps shape-only meta tensors, which MemTracker also counts)."""
    out: dict[str, int] = {}
    for device, device_snapshot in tracker.get_tracker_snapshot(kind).items():
        if device.type == "meta":
            continue
        for key, value in device_snapshot.items():
            out[_category(key)] = out.get(_category(key), 0) + int(value)
    return out


def _deepspeed_engine(model, stage: int, bf16: bool, tp: int = 1):
    import deepspeed
    import torch

    if tp > 1:  # what the Trainer does with deepspeed.json's tensor_parallel before DeepSpeed starts
        model = deepspeed.tp_model_init(model, tp_size=tp, dtype=torch.bfloat16 if bf16 else torch.float32)
    hidden = model.config.hidden_size
    zero = {"stage": stage, "contiguous_gradients": True, "overlap_comm": False,
            # the values Hugging Face's DeepSpeed integration fills in for "auto"
            "reduce_bucket_size": hidden * hidden}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * hidden * hidden), stage3_param_persistence_threshold=10 * hidden)
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1, "zero_optimization": zero,
              "bf16": {"enabled": bf16}, "steps_per_print": 10**9, "wall_clock_breakdown": False,
              **({"tensor_parallel": {"autotp_size": tp}} if tp > 1 else {})}
    trained = [parameter for parameter in model.parameters() if parameter.requires_grad]  # as the Trainer gives it
    optimizer = torch.optim.AdamW(trained, lr=1e-4, foreach=False)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def step(ids):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()

    return engine, step


def _fsdp2_model(model, bf16: bool):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # Accelerate keeps fp32 parameters and computes in bf16 through the policy
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)

    def step(ids):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def _expert_parallel_model(model_dir: str, ranks: int):
    """The saved model in MODEL_DIR loaded as ``tuner run demo-moe-ep`` loads it: transformers' DistributedConfig with
    ep_size and fsdp_size over every rank (each rank ``num_experts / ranks`` experts, FSDP2 over the rest), fp32."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa",
                                                 distributed_config=DistributedConfig(ep_size=ranks, fsdp_size=ranks))
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)

    def step(ids):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def _tensors(obj, depth: int = 0):
    """Every tensor an engine holds in its attributes, lists and dicts (a few levels deep)."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item, depth + 1)


def trace(engine_name: str, precision: str, config, rank: int, model_dir: str = "") -> dict:
    """One engine's traced step on this rank: the peak and the persistent tensors, bytes by MemTracker category.

    FSDP2 is built inside the tracker (its DTensor shards are seen as they are made). DeepSpeed is built and warmed
    up outside it and every tensor its optimizer holds is handed to ``track_external``: on the CPU, DeepSpeed swaps
    parameter storages while it flattens them, which MemTracker would keep counting.
    """
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM

    from tuner.loading.simulate import frozen_aware_tracker

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    lora = engine_name.endswith("-lora")
    if lora:
        from tuner.loading.model import trainable_model

        engine_name = engine_name.removesuffix("-lora")
        model = trainable_model(model, traced_recipe(model_dir, f"{engine_name}-lora:fp32", 1))
    tensor_parallel = engine_name.startswith("autotp")  # the ranks of a tp group compute one batch together
    seed = 0 if tensor_parallel else rank
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))
    tracker = frozen_aware_tracker() if lora else MemTracker()  # LoRA's frozen base gets no gradient hooks
    elements = None
    if engine_name.startswith(("zero", "autotp")):
        tp = int(os.environ["WORLD_SIZE"]) if tensor_parallel else 1
        engine, step = _deepspeed_engine(model, int(engine_name[-1]), precision == "bf16", tp)
        step(ids)  # warm-up: creates the optimizer states
        # ZeRO-3 keeps each parameter's partition in ds_tensor: the optimizer's flat buffers hold the trained ones'
        # (the same storage, counted once), nothing else holds a frozen one's (LoRA's base)
        partitions = [p.ds_tensor for p in engine.module.parameters() if getattr(p, "ds_tensor", None) is not None]
        tracker.track_external(engine.module, engine.optimizer.optimizer, *_tensors(vars(engine.optimizer)), *partitions)
        with tracker:
            step(ids)
            persistent = _snapshot(tracker, "current")
        # the elements of the parameters as this rank holds them (its slice of each split one)
        elements = sum(parameter.numel() for parameter in engine.module.parameters())
    elif engine_name == "ep2":
        model, step = _expert_parallel_model(model_dir, int(os.environ["WORLD_SIZE"]))
        tracker.track_external(model)
        with tracker:
            step(ids)  # warm-up: creates the optimizer states
            _restart_peak(tracker)
            step(ids)
            persistent = _snapshot(tracker, "current")
        elements = sum(parameter.to_local().numel() for parameter in model.parameters())
    else:
        tracker.track_external(model)
        with tracker:
            _, step = _fsdp2_model(model, precision == "bf16")
            step(ids)  # warm-up: creates the optimizer states
            tracker.reset_mod_stats()
            tracker._peak_mem.clear()  # the peak of the traced step only
            tracker._peak_mem_snap.clear()
            step(ids)
            persistent = _snapshot(tracker, "current")
    return {"peak": _snapshot(tracker, "peak"), "persistent": persistent, "elements": elements}


def _restart_peak(tracker) -> None:
    tracker.reset_mod_stats()
    tracker._peak_mem.clear()  # the peak of what follows only
    tracker._peak_mem_snap.clear()


def trace_grpo(engine_name: str, precision: str, config, model_dir: str) -> dict:
    """One GRPO round on this rank (a warm-up round first makes the optimizer states): the generation phase's peak
    (prefill, decoding, the reference's and the old policy's log-probabilities) and the training step's, each with
    the tensors alive between them, as the Trainer would hold them: the policy wrapped by DDP or DeepSpeed, the
    reference frozen (16-bit under DeepSpeed's bf16, as TRL's stage-0 engine casts it), generation unwrapped."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    from tuner.loading.simulate import frozen_aware_tracker, grpo_round

    recipe = grpo_recipe(model_dir, engine_name, dist.get_world_size(), precision)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    for each in (model, reference):
        disable_dropout_in_model(each)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    add_fused_lm_head(reference)
    reference.requires_grad_(False)
    bf16 = precision == "bf16"
    if engine_name == "grpo-ddp":
        trained = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        holders = [optimizer]

        def update(loss):
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        trained, _ = _deepspeed_engine(model, 2, bf16)
        model = trained.module
        reference = reference.to(torch.bfloat16) if bf16 else reference
        holders = [trained.optimizer.optimizer, *_tensors(vars(trained.optimizer))]

        def update(loss):
            trained.backward(loss)
            trained.step()

    generation, loss_step, prompts = grpo_round(model, reference, recipe, config.vocab_size, trained=trained)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16 and engine_name == "grpo-ddp")

    def round_trip():
        with torch.no_grad():  # TRL generates and scores without gradients (and outside autocast)
            return generation(prompts)

    def train_on(ids, scored):
        ids, scored = ids.clone(), {name: values.clone() for name, values in scored.items()}  # the round's buffers
        with autocast:
            loss = loss_step(ids[:GRPO_BATCH], torch.ones(GRPO_BATCH, 1), {k: v[:GRPO_BATCH] for k, v in scored.items()})
        update(loss)

    for _ in range(2):  # warm-up: the optimizer states, and DDP's buckets rebuilt in gradient order (2nd step)
        train_on(*round_trip())
    # DDP's reducer holds a bucket copy of every gradient (gradient_as_bucket_view=False, Accelerate's default) in
    # C++, where the tracker cannot see it: its exact size is added to both peaks
    outside = sum(p.numel() * p.element_size() for p in model.parameters()) if engine_name == "grpo-ddp" else 0
    peaks = {"outside_tracker": outside}
    for phase, work in (("generation", round_trip), ("step", lambda: train_on(*rollout))):
        tracker = frozen_aware_tracker()  # the reference's parameters need no gradient hooks
        tracker.track_external(model, reference, *holders)
        with tracker:
            done = work()
        rollout = done if phase == "generation" else rollout
        peaks[phase] = _snapshot(tracker, "peak")
    return peaks


def main(out_dir: str, model_dir: str, *runs: str) -> int:
    """Trace each ENGINE:PRECISION of ``runs`` in turn, in one process group."""
    import torch.distributed as dist
    from transformers import AutoConfig

    from tuner.train.deepspeed_cpu import init_cpu_deepspeed

    init_cpu_deepspeed()  # one gloo group for both engines
    rank = int(os.environ["RANK"])
    config = AutoConfig.from_pretrained(model_dir)
    config.use_cache = False
    results = {}
    for run in runs:
        engine_name, precision = run.split(":")
        if engine_name.startswith("grpo-"):
            results[run] = trace_grpo(engine_name, precision, config, model_dir)
        else:
            results[run] = trace(engine_name, precision, config, rank, model_dir)
        dist.barrier()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
