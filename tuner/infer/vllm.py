"""``tuner serve --print vllm``: the ``vllm serve`` command for a GPU fleet, sized from the inference plan.

Per GPU at tensor-parallel size ``tp``: the weights (parameters x dtype bytes / tp), a LoRA adapter's weights,
the CUDA context (and NCCL's buffers when ``tp > 1``) — the planner's measured constants — and the KV cache,
``2 x layers x kv_heads_per_gpu x head_dim x bytes`` per token (vLLM splits the KV heads over the GPUs, or
replicates them when there are fewer heads than GPUs). vLLM may use ``gpu_memory_utilization`` of each GPU;
``inference.gpu_headroom_gb`` is left free (for the activations of its profile run, CUDA graphs and fragmentation,
which this plan does not model), at most 95%. ``tensor_parallel_size`` is the fewest GPUs of one machine, allowed
by the head counts, whose memory holds the weights and the KV cache of one sequence of ``max_model_len`` tokens
(the recipe's ``training.max_seq_length`` plus ``inference.max_new_tokens`` unless ``--context`` says otherwise).

The flags are vLLM's documented ``vllm serve`` arguments (tests/data/vllm_serve_flags.txt lists them with their
sources); vLLM itself need not be installed here.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tuner.infer.placement import GIB, format_bytes, kv_cache_bytes

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks (vllm/config/lora.py)
MAX_GPU_MEMORY_UTILIZATION = 0.95


class VllmPlanError(ValueError):
    """No tensor-parallel size fits; the message says what to change."""


@dataclass(frozen=True)
class VllmPlan:
    tensor_parallel_size: int
    max_model_len: int
    gpu_memory_utilization: float
    gpus: int  # of one machine
    gpu_name: str
    capacity_bytes: int
    weights_bytes: int  # per GPU
    adapter_bytes: int  # per GPU
    overhead_bytes: int  # per GPU: CUDA context (+ NCCL)
    kv_bytes_per_token: int  # per GPU

    @property
    def kv_budget_bytes(self) -> int:
        usable = int(self.gpu_memory_utilization * self.capacity_bytes)
        return usable - self.weights_bytes - self.adapter_bytes - self.overhead_bytes

    @property
    def kv_tokens(self) -> int:
        return max(self.kv_budget_bytes, 0) // self.kv_bytes_per_token

    def lines(self) -> list[str]:
        """The plan as the lines printed above the command."""
        tp = self.tensor_parallel_size
        lines = [
            f"vLLM plan on {self.gpus} x {self.gpu_name} ({format_bytes(self.capacity_bytes)} each): "
            f"tensor_parallel_size {tp}, max_model_len {self.max_model_len}, "
            f"gpu_memory_utilization {self.gpu_memory_utilization:.2f}",
            f"  per GPU: weights {format_bytes(self.weights_bytes)}"
            + (f" + adapter {format_bytes(self.adapter_bytes)}" if self.adapter_bytes else "")
            + f" + CUDA context{' and NCCL' if tp > 1 else ''} {format_bytes(self.overhead_bytes)}; "
            f"KV cache {self.kv_bytes_per_token / 1024:.1f} KiB per token",
            f"  KV cache room: {format_bytes(max(self.kv_budget_bytes, 0))} = {self.kv_tokens} tokens, "
            f"{self.kv_tokens // self.max_model_len} sequence(s) of max_model_len at once",
        ]
        if self.gpus // tp > 1:
            lines.append(f"  the other GPUs can hold {self.gpus // tp - 1} more replica(s) (--data-parallel-size)")
        return lines


def lora_rank_for_vllm(r: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds rank ``r``."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise VllmPlanError(f"method.lora.r = {r}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; "
                        "merge the adapter (tuner merge RUN) and serve the merged model.")


def tensor_parallel_sizes(facts, gpus: int) -> list[int]:
    """Sizes vLLM accepts for this model on ``gpus`` GPUs: the attention heads split evenly, and the KV heads
    split evenly or are replicated."""
    return [tp for tp in range(1, gpus + 1) if facts.num_heads % tp == 0
            and (facts.num_kv_heads % tp == 0 or tp % facts.num_kv_heads == 0)]


def plan_vllm(facts, dtype: str, gpus: int, gpu_name: str, capacity_gib: float, headroom_gib: float,
              max_model_len: int, adapter_params: int = 0) -> VllmPlan:
    """The smallest tensor-parallel size that fits (see the module's docstring), or :class:`VllmPlanError`."""
    from tuner.planner.items import CUDA_CONTEXT_GIB, DTYPE_BYTES, NCCL_GIB

    if gpus < 1:
        raise VllmPlanError("vLLM serves on GPUs and the recipe has none: set hardware.gpus_per_machine and "
                            "hardware.gpu (or pass --gpus, e.g. --gpus 1xA100-80GB).")
    dtype_bytes = DTYPE_BYTES[dtype]
    capacity = int(capacity_gib * GIB)
    utilization = min(MAX_GPU_MEMORY_UTILIZATION, math.floor(100 * (capacity_gib - headroom_gib) / capacity_gib) / 100)
    plans = []
    for tp in tensor_parallel_sizes(facts, gpus):
        kv_heads = max(facts.num_kv_heads // tp, 1)
        per_token = kv_cache_bytes(facts, 1, 1, dtype_bytes) * kv_heads // facts.num_kv_heads
        overhead = (CUDA_CONTEXT_GIB + (NCCL_GIB if tp > 1 else 0.0)) * GIB
        plans.append(VllmPlan(tp, max_model_len, utilization, gpus, gpu_name, capacity,
                              facts.total_params * dtype_bytes // tp, adapter_params * dtype_bytes, int(overhead),
                              per_token))
        if plans[-1].kv_tokens >= max_model_len:
            return plans[-1]
    widest = plans[-1] if plans else None
    if widest is None:
        raise VllmPlanError(f"{facts.name}: {facts.num_heads} attention heads do not split over up to {gpus} GPUs.")
    raise VllmPlanError(
        f"{facts.name} does not fit vLLM on {gpus} x {gpu_name} even at tensor_parallel_size "
        f"{widest.tensor_parallel_size}: weights {format_bytes(widest.weights_bytes)} per GPU leave room for "
        f"{widest.kv_tokens} tokens of KV cache, fewer than max_model_len {max_model_len}. Use more or larger GPUs "
        "(--gpus), a shorter --context, or a quantised model.")


def adapter_modules_to_save(adapter: Path) -> list[str]:
    config = json.loads((adapter / "adapter_config.json").read_text())
    return list(config.get("modules_to_save") or [])


def vllm_serve_argv(model: str, plan: VllmPlan, dtype: str, host: str, port: int, served_name: str,
                    tokenizer: str | None = None, chat_template: str | None = None,
                    lora: tuple[str, str, int] | None = None, trust_remote_code: bool = False) -> list[str]:
    """``vllm serve`` as an argument list. ``lora``: (name clients ask for, adapter folder, rank);
    ``trust_remote_code``: the recipe allows the code the model ships (vLLM refuses to run it otherwise)."""
    argv = ["vllm", "serve", model, "--tensor-parallel-size", str(plan.tensor_parallel_size),
            "--max-model-len", str(plan.max_model_len),
            "--gpu-memory-utilization", f"{plan.gpu_memory_utilization:.2f}", "--dtype", dtype]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    if chat_template:
        argv += ["--chat-template", chat_template]
    if lora:
        name, path, rank = lora
        argv += ["--enable-lora", "--lora-modules", f"{name}={path}", "--max-lora-rank", str(lora_rank_for_vllm(rank))]
    else:
        argv += ["--served-model-name", served_name]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    return argv + ["--host", host, "--port", str(port)]
