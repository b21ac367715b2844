"""The analytic memory model: bytes per device for every phase of a run, term by term.

Pure arithmetic on a recipe and the model's architecture facts; no torch import, so a
plan answers in milliseconds.  Every item carries the key of its formula's source,
explained in ``docs/memory.md``.

Each item is live ``always`` (weights, optimizer states) or at some moments.  The training step has three, and
a fourth for an image-text model on image rows: ``vision tower forward`` (the frozen tower's working set, before the
language model's forward), ``loss`` (end of the forward: saved activations plus the logits and loss buffers), ``layer backward``
(backward through one decoder layer, recomputed under gradient checkpointing) and ``optimizer step`` (the
full gradients and the optimizer's temporaries, when gradients are freed between steps).  The other phases of
a run have one moment each: ``evaluation`` (an eval batch, no gradients), ``saving``, ``resuming``,
``merging`` (an adapter into its base) and ``loading`` (weights materialised before training).  A device's
peak is ``always`` plus its largest moment, and its ``terms`` are what is live then, so they add up to its total.

Every item also says where torch would count it (``level``): ``allocated`` (live tensors,
``torch.cuda.max_memory_allocated``), ``reserved`` (what the caching allocator keeps beyond them, so
allocated + reserved items = ``torch.cuda.max_memory_reserved``) or ``device`` (outside the allocator: the CUDA
context, NCCL, the Python process; the sum of all three is what ``nvidia-smi`` shows).
"""
from __future__ import annotations

from tuner.planner.activations import activation_items, eval_items
from tuner.planner.items import (GIB, TIGHT_HEADROOM, CANNOT_JUDGE, STEP, TRAINING_STEP, GENERATION, AFTER_LOADING,
                                 GPU_PHASES, CPU_PHASES, DevicePlan, MemoryPlan)
from tuner.planner.model_states import (model_state_items, module_params, trainable_full, trainable_lora,
                                        trained_outside_layers_items)
from tuner.planner.tower_backward import language_model_setup, tower_backward_items
from tuner.planner.vision import part_summary, tower_items, vision_notes, vision_unmodelled
from tuner.planner.phases import cpu_phase_items, host_phase_items, merge_items, overhead_items
from tuner.planner.rank_setup import Setup, rank_setup
from tuner.planner.reward import reward_counts


def _capacity(recipe) -> tuple[float | None, str]:
    hw = recipe.hardware
    if hw.gpu_memory_gb:
        return float(hw.gpu_memory_gb), hw.gpu or f"{hw.gpu_memory_gb:g}GB"
    if hw.gpu:
        from tuner.catalog.gpus import lookup_gpu

        spec = lookup_gpu(hw.gpu)
        return spec.memory_gib, spec.name
    return None, "GPU"


def _host_ram(recipe) -> float | None:
    if recipe.hardware.host_ram_gb:
        return float(recipe.hardware.host_ram_gb)
    if recipe.uses_gpu:
        return None  # the planning machine's RAM says nothing about the training machines
    import psutil

    return psutil.virtual_memory().total / GIB


def plan(recipe) -> MemoryPlan:
    """Predict the peak memory of every phase of ``recipe``'s run on each device, with a verdict."""
    s = rank_setup(recipe)
    f = s.facts
    gpu_items, host_per_gpu, notes = model_state_items(s)
    saved_items, saved_notes = trained_outside_layers_items(s)
    gpu_items, notes = gpu_items + saved_items, notes + saved_notes
    if s.objective != "sft":
        from tuner.planner.preference import fold_note, reference_items

        on_gpu, on_host = reference_items(s, gpu_items, host_per_gpu)
        gpu_items, host_per_gpu = gpu_items + on_gpu, host_per_gpu + on_host
        notes += fold_note(s)
    if s.teacher is not None:
        from tuner.planner.distill import teacher_items

        on_gpu, on_host = teacher_items(s)
        gpu_items, host_per_gpu = gpu_items + on_gpu, host_per_gpu + on_host
    act_items, act_host, act_notes = activation_items(language_model_setup(s))
    notes += list(f.notes) + vision_notes(s) + act_notes
    items = gpu_items + act_items + tower_items(s) + tower_backward_items(s, gpu_items) + \
        (eval_items(s) if s.evaluates else [])
    if s.experts:
        from tuner.planner.expert_parallel import dispatch_items

        items += dispatch_items(s.experts, f, s.batch * s.seq, s.act_bytes)
        notes.append(s.experts.line())
    capacity, gpu_name = _capacity(recipe)
    if s.rollout:
        from tuner.planner.grpo import rollout_items

        items = rollout_items(s, items, capacity if s.on_gpu else None)
    peak = DevicePlan("probe", None, items).total_gib * GIB
    # the allocator caches T x V loss segments; TRL's fused head (dpo/kto) reuses one tile buffer instead
    loss_bytes = sum(i.bytes for i in act_items if i.category == "logits_loss") if s.objective == "sft" else 0.0
    items += overhead_items(s, peak, loss_bytes)

    devices: list[DevicePlan] = []
    host_ram = 0.0
    generation = (GENERATION,) if s.rollout else ()
    if s.on_gpu:
        devices.append(DevicePlan(f"GPU ({s.world} x {gpu_name})" if s.world > 1 else f"GPU ({gpu_name})",
                                  capacity, items, count=s.world, kind="gpu", phases=GPU_PHASES + generation))
        if s.rollout and s.rollout.backend == "vllm_server" and capacity:
            from tuner.planner.grpo import server_items

            devices.append(DevicePlan(f"vLLM server GPU ({s.rollout.vllm_gpus} x {gpu_name})",
                                      s.rollout.vllm_share * capacity, server_items(s, capacity),
                                      count=s.rollout.vllm_gpus, kind="vllm", phases=(TRAINING_STEP,)))
        per_machine = max(s.gpus_per_machine, 1)
        phase_items, phase_notes = host_phase_items(s)
        host_items = [i.scaled(per_machine, AFTER_LOADING) for i in host_per_gpu] + \
            [i.scaled(per_machine) for i in act_host] + phase_items
        host = DevicePlan(f"host RAM (per machine, {per_machine} GPU(s))", _host_ram(recipe), host_items, kind="host")
        host_ram = host.total_gib
        devices.append(host)
        notes += phase_notes
        if host.capacity_gib is None:
            notes.append(f"host RAM per machine peaks at {host.total_gib:.1f} GiB while {host.moment}; set "
                         "hardware.host_ram_gb to check it against the machines' RAM.")
        if "nvme" in (s.offload_optimizer, s.offload_params):
            notes.append("NVMe offload: the offloaded states live on disk; host RAM then holds only pinned swap "
                         "buffers, which this plan does not model.")
    else:
        processes = s.world
        scaled = [i.scaled(processes) for i in items + cpu_phase_items(s)] if processes > 1 else \
            items + cpu_phase_items(s)
        devices.append(DevicePlan("CPU RAM" + (f" ({processes} processes)" if processes > 1 else ""),
                                  _host_ram(recipe), scaled + merge_items(s), count=1, kind="cpu",
                                  phases=CPU_PHASES + generation))
    if s.objective != "sft" and s.precompute:
        from tuner.planner.preference import reference_pass_items

        training = devices[0]
        process = [i for i in items if i.source in ("measured", "nccl")]  # the process, not its tensors
        pass_items = reference_pass_items(s, gpu_items, process)
        devices.append(DevicePlan(f"{training.name}, reference log-prob pass before training", training.capacity_gib,
                                  [i.scaled(s.world) for i in pass_items] if not s.on_gpu else pass_items,
                                  count=training.count, kind="pass"))
    notes += list(s.kernel_notes) + _setting_notes(recipe, s)

    verdict, missing = _verdict(devices)
    unmodelled = list(s.model.unmodelled) + vision_unmodelled(s)
    if unmodelled:
        verdict, missing = CANNOT_JUDGE, 0.0
        notes.insert(0, f"no verdict: tuner has no memory terms for {'; '.join(unmodelled)}, so the figures above "
                        "leave them out; `tuner plan --simulate` traces the real step on fake tensors.")
    counts = s.model.param_counts
    if s.objective == "reward":  # the model that trains: the body under its score head
        counts = reward_counts(s.model, counts)
    trainable = trainable_full(s) if s.kind == "full" else trainable_lora(s, f) + sum(
        (module_params(s, name) or (0, 0))[0] for name in s.modules_to_save)
    return MemoryPlan(model=recipe.model.id, devices=devices, verdict=verdict, missing_gib=missing,
                      host_ram_gib=host_ram, notes=notes, params=counts.as_dict(), trainable_params=trainable,
                      micro_batch_size=recipe.training.micro_batch_size, max_seq_length=recipe.training.max_seq_length,
                      unmodelled=unmodelled, parts=part_summary(s))


MODEL_STATES = ("weights", "gradients", "optimizer")


def rank_model_states(recipe, moment: str = STEP) -> dict[str, float]:
    """Bytes of weights, gradients and optimizer states one rank holds at ``moment`` (default: the optimizer step),
    as the plan counts them: split by tp, then sharded by ZeRO/FSDP over the data-parallel ranks.  The same items
    as :func:`plan`'s (activations, buffers and overhead left out), for comparing with a per-rank trace."""
    items, _, _ = model_state_items(rank_setup(recipe))
    return {category: sum(i.bytes for i in items if i.category == category and i.live_in(moment))
            for category in MODEL_STATES}


def _lora_left_out(recipe, f) -> list[str]:
    """The module groups the recipe's LoRA targets would reach but PEFT cannot run (ModuleGroup.lora_excluded)."""
    targets = recipe.method.lora.target_modules
    return [f"{group.pattern} ({group.module})" for group in (f.inventory.groups if f.inventory else ())
            if group.lora_excluded and (targets == "all-linear" or group.leaf in targets)]


def _setting_notes(recipe, s: Setup) -> list[str]:
    """What the recipe sets that changes memory in ways the plan models only in part (or not at all)."""
    f, mem = s.model, recipe.memory
    notes = []
    if s.quant_bits and s.distributed in ("fsdp", "deepspeed") and (s.distributed == "fsdp" or s.zero == 3):
        notes.append("QLoRA sharded with ZeRO-3/FSDP stores 4-bit weights as the compute dtype "
                     "(bnb_4bit_quant_storage); tuner's loader sets it.")
    if s.quant_bits and f.is_moe:
        notes.append("bitsandbytes quantises only nn.Linear layers: the fused MoE experts of transformers v5 stay "
                     "unquantised, and k-bit preparation casts them to fp32.")
    if s.mixed and s.kind == "full" and s.distributed in ("none", "ddp") and s.weight_bytes == 2:
        notes.append("16-bit weights with 16-bit AdamW states (no fp32 master copy), as the Hugging Face Trainer "
                     "does for bf16 weights; load float32 weights for classic mixed precision.")
    if not s.mixed and s.weight_bytes == 2 and s.kind != "full":
        notes.append("16-bit weights without autocast: PEFT keeps the adapters in fp32 (autocast_adapter_dtype), "
                     "casts each adapted layer's input to fp32 and adds the fp32 branch to the 16-bit output, so the "
                     "LoRA branches, their gradients and AdamW states are fp32 while the rest runs in "
                     f"{recipe.model.dtype}; counted so.")
    if s.kind != "full" and (left_out := _lora_left_out(recipe, f)):
        notes.append(f"LoRA: no adapter on {', '.join(left_out)}: its forward returns other than the linear map of "
                     "its input, which PEFT's LoRA cannot wrap; training leaves it out too, and so does this count.")
    if mem.liger and not s.on_gpu:
        notes.append("memory.liger: Liger's Triton kernels need a GPU; a CPU run trains without them, and so does "
                     "this plan.")
    elif s.liger:
        notes.append("memory.liger: counts Liger's fused RMSNorm, SwiGLU and linear cross-entropy by their published "
                     "formulas (not measured here); it assumes liger-kernel is installed on the training machines and "
                     f"supports model_type {f.model_type!r}, else the run trains without them and needs more.")
    if mem.torch_compile:
        notes.append("memory.torch_compile: not modelled; inductor fuses element-wise ops and usually saves "
                     "activation memory, so the plan errs high (and the first steps compile).")
    if s.chunked_loss and s.on_gpu:
        notes.append("memory.chunked_loss: torch's chunked linear cross-entropy on CUDA is counted by its "
                     "buffer layout (compact, aspect_ratio:2), checked against CPU traces; not measured on a GPU.")
    if s.activation_offloading:
        notes.append("memory.activation_offloading: the checkpointed layer inputs live in pinned host RAM "
                     "(counted on the host device); each crosses PCIe twice per step.")
    return notes


def _verdict(devices: list[DevicePlan]) -> tuple[str, float]:
    checked = [d for d in devices if d.capacity_gib is not None]
    if not checked:
        return "unknown", 0.0
    missing = max(max(-(d.headroom_gib or 0.0), 0.0) for d in checked)
    if missing > 0:
        return "does not fit", missing
    if any(d.headroom_gib < TIGHT_HEADROOM * d.capacity_gib for d in checked):
        return "tight", 0.0
    return "fits", 0.0
