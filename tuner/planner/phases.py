"""Phases beyond the training step (merging, loading, saving and resuming in host RAM or on the device) and the
overhead every process carries: the CUDA context, NCCL, the caching allocator's reserve."""
from __future__ import annotations

from tuner.planner.items import (GIB, STEP, SAVE, RESUME, MERGE, LOAD, BACKWARD, CUDA_CONTEXT_GIB, NCCL_GIB,
                                 ALLOCATOR_ROUNDING, CPU_PROCESS_GIB, SAFETENSORS_SHARD_BYTES, Item)
from tuner.planner.model_states import trainable_lora
from tuner.planner.rank_setup import Setup


def merge_items(s: Setup) -> list[Item]:
    """Merging the adapter into its base (output.save merged/full, on rank 0 after training; ``tuner merge`` the
    same): the base loaded unquantised in model.dtype on the CPU, plus the fp32 adapter (tuner.loading.merge)."""
    if s.kind == "full" or s.save not in ("merged", "full"):
        return []
    f = s.model
    return [Item("merging: base model in model.dtype and the fp32 adapter (rank 0)", "weights",
                 f.total_params * s.weight_bytes + trainable_lora(s, f) * 4, MERGE,
                 source="peft-merge")]


def host_phase_items(s: Setup) -> tuple[list[Item], list[str]]:
    """Host RAM of one machine (of a GPU recipe) while loading, saving and resuming; ``gpus_per_machine``
    processes share it; the weights are loaded, saved and resumed whole."""
    f = s.model
    total, per_machine, n = f.total_params, max(s.gpus_per_machine, 1), s.world
    lora_bytes = 0 if s.kind == "full" else trainable_lora(s, f) * 4
    deepspeed, fsdp = s.distributed == "deepspeed" and s.zero is not None, s.distributed == "fsdp"
    w16 = 2 if s.mixed else 4  # DeepSpeed's module dtype
    master = 4 if s.mixed or s.weight_bytes == 4 else s.weight_bytes  # FSDP parameters after Accelerate's upcast
    trainable = total if s.kind == "full" else trainable_lora(s, f)
    notes, items = [], []
    # loading: from_pretrained materialises the weights on the CPU in every process before they move to the GPU
    if deepspeed and s.zero == 3:
        items.append(Item(f"loading: each process keeps its 1/{n} partition (ZeRO-3 zero.Init)", "weights",
                          total * s.weight_bytes / n * per_machine, LOAD, source="hf-deepspeed"))
        notes.append("ZeRO-3 loading also reads whole checkpoint shards in every process; the plan counts the "
                     "partitions only.")
    elif fsdp and s.fsdp_ram_efficient_loading:
        items.append(Item("loading: weights on the first process only (fsdp.cpu_ram_efficient_loading)", "weights",
                          total * s.weight_bytes, LOAD, source="fsdp"))
    else:
        items.append(Item(f"loading: weights materialised on the CPU by each of {per_machine} process(es)", "weights",
                          total * s.weight_bytes * per_machine, LOAD, source="hf-loading"))
    # saving: what rank 0 gathers or copies into host RAM before it writes
    if deepspeed and s.zero == 3:
        items.append(Item("saving: 16-bit weights gathered on rank 0 (stage3_gather_16bit_weights_on_model_save)",
                          "weights", total * w16, SAVE, source="ds-save"))
    elif fsdp:
        if s.fsdp_full_state_dict:  # sharded: each rank writes its own shard, nothing is gathered
            items.append(Item("saving: full state dict gathered on rank 0 (fsdp.state_dict_type: full)", "weights",
                              total * master, SAVE, source="fsdp"))
    elif s.kind == "full":
        weights = total * (w16 if deepspeed else s.weight_bytes)
        items.append(Item("saving: safetensors copies a shard (up to 50 GB) into host RAM on rank 0", "weights",
                          min(weights, SAFETENSORS_SHARD_BYTES), SAVE, source="safetensors"))
    else:
        items.append(Item("saving: the adapter on rank 0", "lora_adapter", lora_bytes, SAVE, source="peft"))
    # resuming: checkpoints are read into host RAM by every process before they reach the GPU
    if not s.resumable:
        pass
    elif deepspeed:
        model_states = total * w16 / (n if s.zero == 3 else 1) if s.kind == "full" else lora_bytes
        optimizer = trainable * 12 / (n if s.zero >= 1 else 1)
        items.append(Item("resuming: each process loads its model states and optimizer partition to the CPU",
                          "optimizer", (model_states + optimizer) * per_machine, RESUME, source="ds-checkpoint"))
    elif fsdp and s.fsdp_full_state_dict:
        items.append(Item("resuming: full model and optimizer state dicts loaded on rank 0", "optimizer",
                          total * master + trainable * 2 * master, RESUME, source="fsdp"))
    elif fsdp:
        items.append(Item("resuming: each process reads its model and optimizer shards", "optimizer",
                          (total + trainable * 2) * master / n * per_machine, RESUME, source="fsdp"))
    elif s.kind == "full":
        items.append(Item("resuming: each process loads the checkpoint's weights to the CPU", "weights",
                          total * s.weight_bytes * per_machine, RESUME, source="hf-loading"))
    else:
        items.append(Item("resuming: each process loads the adapter", "lora_adapter", lora_bytes * per_machine,
                          RESUME, source="peft"))
    return items + merge_items(s), notes


def cpu_phase_items(s: Setup) -> list[Item]:
    """On a CPU recipe, per process: resuming full weights reads a copy before load_state_dict copies it in."""
    if s.kind != "full" or not s.resumable:
        return []
    return [Item("resuming: the checkpoint's weights read before they are copied in", "weights",
                 s.model.total_params * s.weight_bytes, RESUME, source="hf-loading")]


def overhead_items(s: Setup, tensors: float, loss_bytes: float) -> list[Item]:
    if not s.on_gpu:
        return [Item("Python, torch and transformers in the process", "overhead", CPU_PROCESS_GIB * GIB,
                     source="measured", level="device")]
    items = [Item("CUDA context and library workspaces", "overhead", CUDA_CONTEXT_GIB * GIB, source="measured",
                  level="device")]
    if s.world > 1:
        items.append(Item("NCCL communicator buffers", "overhead", NCCL_GIB * GIB, source="nccl", level="device"))
    return items + _allocator_items(tensors, loss_bytes)


def _allocator_items(tensors: float, loss_bytes: float) -> list[Item]:
    """What PyTorch's caching allocator reserves beyond the live tensors (max_memory_reserved - allocated).

    The loss path allocates T x V buffers of two sizes (16-bit logits and their gradient, fp32 upcast,
    log-softmax and its gradients); a freed fp32 block split by a 16-bit request cannot take the next fp32
    one, so a whole fp32 logits segment (a third of the 12 T x V bytes of the loss buffers) stays cached through
    the forward/backward.  When the peak is the optimizer step, the gradients, AdamW states and foreach
    temporaries (parameter-shaped) fill the segments the loss buffers left only in part: all of them count.
    Measured on an H200 (docs/memory.md); a fused or chunked loss scales both with its own buffers.
    """
    rounding = Item(f"caching-allocator rounding and split blocks ({ALLOCATOR_ROUNDING:.0%} of tensors)", "overhead",
                    ALLOCATOR_ROUNDING * tensors, source="allocator", level="reserved")
    if not loss_bytes:  # TRL's fused head (dpo/kto) reuses one tile buffer: no loss segments to cache
        return [rounding]
    return [
        rounding,
        Item("cached fp32 logits segment (a third of the loss buffers)", "overhead", loss_bytes / 3, BACKWARD,
             source="allocator", level="reserved"),
        Item("cached segments of the loss buffers, partly refilled by the step", "overhead", loss_bytes, STEP,
             source="allocator", level="reserved"),
    ]
