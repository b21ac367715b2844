"""The plan's vocabulary: the moments and phases of a run, the sizes of a byte, and the items and plans built of them.

Every planner module speaks it, so it sits below them all (``memory`` and ``preference`` both import it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

GIB = 2**30
TIGHT_HEADROOM = 0.10  # less than 10% of a device left free is "tight": fragmentation and spikes can still OOM
CANNOT_JUDGE = "cannot judge"  # the model has a part no memory term covers: no verdict rather than a guess

CATEGORIES = ("weights", "reference_model", "reward_model", "teacher_model", "lora_adapter", "gradients", "optimizer", "activations",
              "logits_loss", "generation", "overhead")
ALWAYS, FORWARD_BACKWARD, LAYER_BACKWARD, STEP = "always", "loss", "layer backward", "optimizer step"
TOWER = "vision tower forward"  # an image-text step's frozen tower, before the language model's forward
TOWER_BACKWARD = "vision tower backward"  # a trained tower's (or projector's) backward, the step's last
PREFILL, DECODING, SCORING = "prefill", "decoding", "scoring"  # grpo's rollout (tuner.planner.grpo)
EVAL, SAVE, RESUME, MERGE, LOAD = "evaluation", "saving", "resuming", "merging", "loading"
STEP_MOMENTS = (TOWER, FORWARD_BACKWARD, LAYER_BACKWARD, TOWER_BACKWARD, STEP)
GENERATION_MOMENTS = (PREFILL, DECODING, SCORING)
MOMENTS = STEP_MOMENTS + GENERATION_MOMENTS + (EVAL, SAVE, RESUME, MERGE, LOAD)
TRAINING_STEP, GENERATION = "training step", "generation"
PHASES = {moment: TRAINING_STEP if moment in STEP_MOMENTS else GENERATION if moment in GENERATION_MOMENTS else moment
          for moment in MOMENTS}  # moment -> phase
RUN_PHASES = tuple(phase for phase in dict.fromkeys(PHASES.values()) if phase != GENERATION)  # of every run
BACKWARD = (FORWARD_BACKWARD, LAYER_BACKWARD)  # live from the forward until the backward ends
AFTER_LOADING = tuple(m for m in MOMENTS if m != LOAD)  # made when training starts (optimizer states, buffers)
GPU_PHASES = (TRAINING_STEP, EVAL, SAVE, RESUME)  # loading and merging happen in host RAM (grpo adds generation)
CPU_PHASES = (TRAINING_STEP, EVAL, SAVE, RESUME, MERGE)  # loading: the loaded weights are the ones trained
LEVELS = ("allocated", "reserved", "device")  # torch's max_memory_allocated, max_memory_reserved, nvidia-smi

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
NF4_DOUBLE_QUANT_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4 bits + 8-bit absmax per 64 + fp32 absmax per 256 blocks = 4.127 bits
NF4_BYTES = 0.5 + 4 / 64  # 4 bits + fp32 absmax per 64-value block = 4.5 bits
ADAM8BIT_BYTES = 2 + 2 * 4 / 256  # two 1-byte moments + an fp32 absmax per 256-value block each
CUDA_CONTEXT_GIB = 0.75  # CUDA context, cuBLAS/cuDNN handles and workspaces of one process (measured on an H200)
NCCL_GIB = 0.5  # NCCL communicator buffers when several GPUs talk
ALLOCATOR_ROUNDING = 0.02  # caching allocator: rounding, small-block pools, split remainders (share of tensors)
CPU_PROCESS_GIB = 1.0  # a Python process with torch and transformers imported, before any tensor
SAFETENSORS_SHARD_BYTES = 50e9
ZERO3_MAX_LIVE_PARAMETERS = 1e9  # DeepSpeed's stage3_max_live_parameters (and stage3_max_reuse_distance) default  # transformers 5 save_pretrained's default max_shard_size ("50GB")


@dataclass(frozen=True)
class Item:
    """One memory consumer on one device."""

    name: str
    category: str
    bytes: float
    phase: str | tuple[str, ...] = ALWAYS  # ALWAYS, one moment, or a tuple of moments
    source: str = ""
    level: str = "allocated"  # allocated (tensors), reserved (allocator cache) or device (outside the allocator)

    def live_in(self, moment: str) -> bool:
        return self.phase == ALWAYS or self.phase == moment or (isinstance(self.phase, tuple) and moment in self.phase)

    @property
    def gib(self) -> float:
        return self.bytes / GIB

    def scaled(self, factor: float, phase: str | tuple[str, ...] | None = None) -> "Item":
        return Item(self.name, self.category, self.bytes * factor, self.phase if phase is None else phase, self.source,
                    self.level)


@dataclass
class DevicePlan:
    """Memory of one device (every GPU of a data-parallel run holds the same; ``count`` says how many)."""

    name: str
    capacity_gib: float | None
    items: list[Item]
    count: int = 1
    kind: str = "gpu"  # gpu, cpu (training on the CPU) or host (RAM of each GPU machine)
    phases: tuple[str, ...] = RUN_PHASES  # the phases this device takes part in
    moment: str = ALWAYS  # the moment of the peak
    terms: dict[str, float] = field(default_factory=dict)
    total_gib: float = 0.0

    def __post_init__(self):
        self.moment = max(self.moments, key=self.moment_gib)
        self.terms = self.terms_at(self.moment)
        self.total_gib = sum(self.terms.values())

    def terms_at(self, moment: str) -> dict[str, float]:
        """GiB by category of what is live at ``moment``."""
        live = [i for i in self.items if i.live_in(moment)]
        return {c: sum(i.bytes for i in live if i.category == c) / GIB for c in CATEGORIES}

    def phase_moment(self, phase: str) -> str:
        """The moment a phase peaks at."""
        return max((m for m in self.moments if PHASES[m] == phase), key=self.moment_gib)

    @property
    def moments(self) -> tuple[str, ...]:
        return tuple(m for m in MOMENTS if PHASES[m] in self.phases)

    def moment_gib(self, moment: str, levels: tuple[str, ...] = LEVELS) -> float:
        return sum(i.bytes for i in self.items if i.live_in(moment) and i.level in levels) / GIB

    @property
    def phase(self) -> str:
        """The phase of the run the peak falls in (training step, evaluation, saving, ...)."""
        return PHASES[self.moment]

    def phase_gib(self, phase: str, levels: tuple[str, ...] = LEVELS) -> float:
        """The peak of one phase (``levels=("allocated",)``: its live tensors only)."""
        return max(self.moment_gib(m, levels) for m in self.moments if PHASES[m] == phase)

    @property
    def allocated_gib(self) -> float:
        """Peak of live tensors over every moment: compare with ``torch.cuda.max_memory_allocated``."""
        return max(self.moment_gib(m, ("allocated",)) for m in self.moments)

    @property
    def reserved_gib(self) -> float:
        """Peak of the caching allocator's segments: compare with ``torch.cuda.max_memory_reserved``."""
        return max(self.moment_gib(m, ("allocated", "reserved")) for m in self.moments)

    @property
    def headroom_gib(self) -> float | None:
        return None if self.capacity_gib is None else self.capacity_gib - self.total_gib

    @property
    def live_items(self) -> list[Item]:
        return [i for i in self.items if i.live_in(self.moment)]

    def to_dict(self) -> dict:
        return {
            "name": self.name, "kind": self.kind, "count": self.count,
            "peak_phase": self.phase, "peak_moment": self.moment,
            "capacity_gib": _round(self.capacity_gib),
            "allocated_gib": _round(self.allocated_gib), "reserved_gib": _round(self.reserved_gib),
            "device_gib": _round(self.total_gib), "total_gib": _round(self.total_gib),
            "headroom_gib": _round(self.headroom_gib),
            "phases_gib": {phase: _round(self.phase_gib(phase)) for phase in self.phases},
            "terms_gib": {k: _round(v) for k, v in self.terms.items()},
            "items": [{"name": i.name, "category": i.category, "level": i.level, "gib": _round(i.gib),
                       "phase": list(i.phase) if isinstance(i.phase, tuple) else i.phase,
                       "live_at_peak": i.live_in(self.moment), "source": i.source} for i in self.items],
        }


@dataclass
class MemoryPlan:
    """The predicted peak memory of a recipe on its hardware, with a verdict."""

    model: str
    devices: list[DevicePlan]
    verdict: str  # "fits", "tight", "does not fit", "unknown" (no capacity given) or CANNOT_JUDGE
    missing_gib: float
    host_ram_gib: float  # host RAM each machine needs at its peak (offloaded states, loading, saving, merging)
    notes: list[str]
    params: dict[str, int]
    trainable_params: int
    micro_batch_size: int
    max_seq_length: int
    unmodelled: list[str] = field(default_factory=list)  # the model's parts no term covers (verdict CANNOT_JUDGE)
    # an image-text model's parts (tuner.planner.vision.part_summary): part -> params, weights_gib, trains
    parts: dict[str, dict] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.verdict not in ("does not fit", CANNOT_JUDGE)

    @property
    def gpu(self) -> DevicePlan:
        """The training device (a GPU, or the CPU for CPU recipes)."""
        return self.devices[0]

    @property
    def limiting(self) -> DevicePlan:
        """The device that decides the verdict: the largest shortfall, else the least headroom relative to its
        capacity (the training device where no capacity is known)."""
        checked = [d for d in self.devices if d.capacity_gib]
        if not checked:
            return self.gpu
        short = [d for d in checked if d.headroom_gib < 0]
        if short:
            return min(short, key=lambda d: d.headroom_gib)
        return min(checked, key=lambda d: d.headroom_gib / d.capacity_gib)

    def to_dict(self) -> dict:
        limiting = self.limiting
        return {
            "units": {"memory": "GiB (2^30 bytes)", "params": "parameters"},
            "model": self.model, "verdict": self.verdict, "missing_gib": _round(self.missing_gib),
            "peak": {"device": limiting.name, "phase": limiting.phase, "moment": limiting.moment,
                     "gib": _round(limiting.total_gib)},
            "host_ram_gib": _round(self.host_ram_gib), "params": self.params,
            "trainable_params": self.trainable_params, "micro_batch_size": self.micro_batch_size,
            "max_seq_length": self.max_seq_length, "unmodelled": self.unmodelled, "parts": self.parts,
            "devices": [d.to_dict() for d in self.devices], "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
