"""The sections that say where a run runs and how it fits there: the machines and GPUs, the memory tactics
(sharding, offload, recomputation, kernels, precision) and the splitting of one model across ranks.

Assembled with the other sections in :class:`tuner.recipe.schema.Recipe`; the rules that relate their fields live
in :mod:`tuner.recipe.checks`.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from tuner.recipe.section import OutputFolder, Section, is_host


class HardwareSection(Section):
    machines: int = Field(1, ge=1, le=4096, description="Number of machines (nodes) taking part in the run.")
    gpus_per_machine: int = Field(
        0, ge=0, le=64, description="GPUs on each machine. 0 runs on the CPU (useful for tests and the demo)."
    )
    num_processes: int | None = Field(
        None,
        ge=1,
        le=262144,
        description="Total training processes. Resolved to machines x gpus_per_machine on GPUs; "
        "on the CPU it sets how many gloo processes run (default 1).",
    )
    gpu: str | None = Field(
        None,
        description="GPU type from the catalog (e.g. A100-80GB, H100-80GB, RTX4090) or a custom size such as '48GB'. "
        "Used by the planner; required when gpus_per_machine > 0 unless gpu_memory_gb is given.",
    )
    gpu_memory_gb: float | None = Field(
        None, gt=0, le=4096, description="Memory of one GPU in GiB; overrides the catalog value of hardware.gpu."
    )
    host_ram_gb: float | None = Field(
        None, gt=0, le=1048576, description="CPU RAM per machine in GiB; the planner checks CPU offload against it."
    )
    nvme_path: OutputFolder | None = Field(None, description="Local NVMe directory for DeepSpeed ZeRO-Infinity offload.")
    main_process_ip: str | None = Field(
        None, description="Address of machine rank 0 (an IP address or a host name); required when machines > 1."
    )
    main_process_port: int = Field(29500, ge=1, le=65535, description="TCP port of the rendezvous on machine rank 0.")
    rdzv_backend: Literal["static", "c10d"] = Field(
        "static", description="Rendezvous backend for multi-node launches (c10d tolerates nodes joining late)."
    )

    @field_validator("main_process_ip")
    @classmethod
    def _a_host(cls, value: str | None) -> str | None:
        if value is not None and not is_host(value):
            raise ValueError("must be a host name or an IP address (e.g. 10.0.0.1 or node001.cluster)")
        return value


class FsdpSection(Section):
    sharding_strategy: Literal["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"] = Field(
        "full_shard", description="What FSDP shards: full_shard = parameters, gradients and optimizer states (like ZeRO-3)."
    )
    state_dict_type: Literal["full", "sharded"] = Field(
        "full", description="Checkpoint layout: full gathers one state dict on rank 0; sharded saves one file per rank."
    )
    cpu_ram_efficient_loading: bool = Field(
        True, description="Load weights on rank 0 only and broadcast, so host RAM holds one copy instead of one per GPU."
    )


class MemorySection(Section):
    distributed: Literal["none", "ddp", "deepspeed", "fsdp"] = Field(
        "none",
        description="How several processes share the work: none (one process), ddp (replicate), "
        "deepspeed (ZeRO sharding, set zero_stage) or fsdp (PyTorch FSDP2 sharding).",
    )
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        None,
        description="DeepSpeed ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also parameters. "
        "Only with distributed: deepspeed.",
    )
    offload_optimizer: Literal["none", "cpu", "nvme"] = Field(
        "none", description="Move optimizer states (and the optimizer step) off the GPU. Needs ZeRO or FSDP."
    )
    offload_params: Literal["none", "cpu", "nvme"] = Field(
        "none", description="Move parameters off the GPU between uses. Needs ZeRO-3 or FSDP."
    )
    fsdp: FsdpSection = Field(default_factory=FsdpSection, description="FSDP settings, used with distributed: fsdp.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass instead of storing them (~30% slower, far less memory)."
    )
    activation_offloading: bool = Field(
        False,
        description="Hold the checkpointed layer inputs in pinned CPU RAM instead of GPU memory (transformers' "
        "activation-checkpointing offload): frees layers x tokens x hidden size of GPU memory, at the cost of a copy "
        "each way per step. Needs gradient_checkpointing and a GPU.",
    )
    chunked_loss: bool = Field(
        False,
        description="Compute the output head and cross-entropy in chunks of tokens (torch.nn.functional."
        "linear_cross_entropy), so the tokens x vocabulary logits are never built whole. Not with ZeRO-3 or FSDP "
        "(the output head is sharded outside its own forward), nor with liger (its fused loss does the same on GPU).",
    )
    attention: Literal["auto", "flash", "sdpa", "eager"] = Field(
        "auto",
        description="Attention kernel: flash (flash-attn 2, CUDA only), sdpa (PyTorch fused), eager (stores the "
        "s x s score matrix) or auto (flash when installed and supported, else sdpa, else eager for a model class without "
        "sdpa, such as Gemma-2). validate refuses what the model class does not support.",
    )
    liger: bool = Field(False, description="Use Liger fused kernels (RMSNorm, SwiGLU, fused linear cross-entropy) when installed.")
    mixed_precision: Literal["bf16", "fp16", "no"] = Field(
        "bf16", description="Autocast precision of the forward/backward pass; 'no' trains in the weights' dtype."
    )
    torch_compile: bool = Field(False, description="Compile the model with torch.compile (faster steps after a slow first one).")

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no_is_a_word(cls, value):
        """YAML 1.1 reads a bare ``no`` as false; here it means the precision named 'no'."""
        return "no" if value is False else value


class ParallelismSection(Section):
    tp: int = Field(
        1, ge=1, le=1024,
        description="Tensor-parallel degree: every decoder layer's linear weights are split across this many ranks of "
        "one machine, which compute each layer together. With distributed: deepspeed it is DeepSpeed AutoTP "
        "(ZeRO 0-2); with fsdp, transformers' tensor-parallel plan under Accelerate's ParallelismConfig. 1: off.",
    )
    cp: int = Field(
        1, ge=1, le=1024,
        description="Context-parallel degree: each sequence is split along its tokens across this many GPUs (ring "
        "attention, torch's context_parallel). Needs distributed: fsdp and sdpa attention. 1: off.",
    )
    sp: int = Field(
        1, ge=1, le=1024,
        description="Sequence-parallel degree with DeepSpeed Ulysses: the tokens are split across this many GPUs and "
        "attention heads are exchanged all-to-all. Needs distributed: deepspeed; heads divisible by sp. 1: off.",
    )
    ep: int = Field(
        1, ge=1, le=1024,
        description="Expert-parallel degree for MoE models: each rank holds num_experts / ep whole experts and the "
        "routed tokens travel to them all-to-all (transformers' DistributedConfig ep_size, with FSDP2 over dp_shard). "
        "Needs distributed: fsdp and a model whose config has a base_model_ep_plan; a multiple of tp dividing "
        "dp_shard x tp. 1: off.",
    )
    pp: int = Field(
        1, ge=1, le=1024,
        description="Pipeline stages (transformers' DistributedConfig pp_size): the decoder layers split into this "
        "many consecutive stages. transformers' stages run forward only, so a recipe refuses it; tuner infer/chat --pp N "
        "runs them for inference. 1: off.",
    )
    dp_replicate: int | None = Field(
        None, ge=1, le=262144,
        description="fsdp with tp, cp or ep: copies of the FSDP-sharded model (HSDP, e.g. one per machine). Default 1.",
    )
    dp_shard: int | None = Field(
        None, ge=1, le=262144,
        description="fsdp with tp, cp or ep: ranks each model copy is FSDP-sharded across. Default: the processes left "
        "over, num_processes / (dp_replicate x tp x cp).",
    )

    @property
    def model_parallel(self) -> int:
        """Ranks that work on one batch together (tp x cp x sp); 1 when only data is parallel."""
        return self.tp * self.cp * self.sp
