"""The recipe schema: one pydantic model per concern, assembled in :class:`Recipe`.

The sections of where the run runs and how it fits (hardware, memory, parallelism) are in
:mod:`tuner.recipe.compute`, the objective's in :mod:`tuner.recipe.objective`.  Every field carries a
description; the same text generates ``docs/recipes.md``, the CLI help and the TUI's help.  Type checks live
here; rules that relate several fields live in :mod:`tuner.recipe.checks` so each can name the field to change.
"""
from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from tuner.catalog.demo import DEMO_MODEL_ID, DEMO_MOE_MODEL_ID
from tuner.recipe.compute import HardwareSection, MemorySection, ParallelismSection
from tuner.recipe.objective import DPO_DEFAULT_BETA, TRL_LOSS_TYPES, DistillSection, GrpoSection, ObjectiveSection
from tuner.recipe.section import OutputFolder, PathText, Section

SCHEMA_VERSION = 2  # 2: batch, sequence and optimizer moved from memory: to training: (recipe/migration.py)
# Experiment trackers the Trainer reports to (its own integrations); each is also the name of tuner's pip extra.
Tracker = Literal["tensorboard", "mlflow", "wandb", "trackio"]
TRACKERS: tuple[str, ...] = get_args(Tracker)


class ModelSection(Section):
    id: PathText = Field(
        DEMO_MODEL_ID,
        min_length=1,
        description="What to fine-tune: a Hugging Face hub id (org/name), a local directory "
        f"holding config.json, or {DEMO_MODEL_ID} (a tiny Llama) or {DEMO_MOE_MODEL_ID} (a tiny Qwen3-MoE), the models "
        "tuner builds itself.",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) to load; ignored for local paths.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="Dtype the weights are loaded in. auto: bfloat16 with bf16 mixed precision, "
        "float16 with fp16, float32 otherwise.",
    )
    trust_remote_code: bool = Field(
        False,
        description="Run Python code shipped with the model repository. Off unless you trust the author: "
        "it executes arbitrary code on every rank.",
    )


class LoraSection(Section):
    r: int = Field(16, ge=1, le=4096, description="LoRA rank: width of the low-rank update matrices.")
    alpha: float = Field(32, gt=0, description="LoRA scaling numerator; the update is scaled by alpha / r.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout applied to the LoRA branch input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="Module names to adapt (e.g. [q_proj, v_proj]) or all-linear for every linear layer but the output head.",
    )
    target_parameters: list[str] = Field(
        default_factory=list,
        description="Parameters to adapt directly (PEFT's target_parameters), e.g. [mlp.experts.gate_up_proj, "
        "mlp.experts.down_proj] for a mixture of experts whose experts transformers fuses into 3-D tensors; PEFT "
        "needs dropout: 0 for them.",
    )
    modules_to_save: list[str] = Field(
        default_factory=list,
        description="Modules trained in full beside the adapters and saved with them (e.g. [norm] for the final norm, "
        "[embed_tokens, lm_head] after adding tokens).",
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _names_as_a_list(cls, value):
        """``q_proj,v_proj`` (as ``--set`` passes an unbracketed list) or one name means those names."""
        if isinstance(value, str) and value != "all-linear":
            return [name.strip() for name in value.split(",") if name.strip()]
        return value


class QuantizationSection(Section):
    bits: Literal[4, 8] = Field(4, description="Bits per frozen base weight with bitsandbytes: 4 (QLoRA) or 8.")
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type: nf4 (NormalFloat, QLoRA's) or fp4.")
    double_quant: bool = Field(True, description="Quantise the quantisation constants too (saves ~0.37 bits/parameter).")


class MethodSection(Section):
    kind: Literal["full", "lora", "qlora"] = Field(
        "full",
        description="full: train every weight. lora: train low-rank adapters on frozen weights. "
        "qlora: LoRA on a 4/8-bit quantised base model.",
    )
    lora: LoraSection = Field(default_factory=LoraSection, description="Adapter settings for lora and qlora.")
    quantization: QuantizationSection | None = Field(
        None, description="bitsandbytes quantisation of the frozen base model; required by qlora, refused otherwise."
    )
    allow_method_change: bool = Field(
        False, description="Let the advisor propose a cheaper method (LoRA, then QLoRA) when nothing else fits."
    )
    train: list[Literal["language_model", "projector", "vision_tower"]] = Field(
        default_factory=lambda: ["language_model"], min_length=1,
        description="The parts of an image-text model that train (in full for kind full, with adapters for lora "
        "and qlora): language_model, projector (the merger or connector that maps image features to tokens), "
        "vision_tower; the others are loaded and frozen. A causal LM is all language_model.",
    )


STREAM_SHUFFLE_BUFFER = 10_000  # samples a stream is shuffled within (a stream has no global shuffle)


class DataSection(Section):
    source: PathText = Field(
        "builtin:reverse",
        min_length=1,
        description="Training data: a local .json/.jsonl/.csv/.parquet file, a datasets name in the local cache, "
        "builtin:reverse (the demo's word-reversal task), builtin:reverse-pairs (its preference pairs: the right "
        "reversal chosen, a near miss rejected), builtin:reverse-prompts (its prompts with an answer column, for "
        "grpo), builtin:reverse-run-prompts (prompts of one letter then a run of another, held out from the others) or "
        "builtin:shapes (image_prompt_answer rows: Pillow-drawn shapes to name with their colour, for builtin:demo-vlm).",
    )
    format: Literal["auto", "text", "instruction", "chat", "preference", "unpaired_preference", "prompt",
                    "image_prompt_answer", "image_chat"] = Field(
        "auto",
        description="Sample layout: text (a 'text' column), instruction (instruction/input/output), chat (messages with roles); "
        "for dpo, preference (prompt/chosen/rejected); for kto, unpaired_preference (prompt/completion/label); for "
        "grpo, prompt (a 'prompt' column, text or messages, and any columns the rewards read). "
        "Preference values are text or lists of role/content messages. For image-text models: image_prompt_answer "
        "(image/prompt/answer, the image a path relative to the data file) or image_chat (messages whose user turns "
        "hold {type: image} parts, with an images column or each part's own image path). auto detects it from the "
        "columns.",
    )
    max_image_pixels: int = Field(
        4096 * 4096, ge=1, le=2**31,
        description="The most pixels (width x height) one image of image-text data may hold; a larger image is "
        "refused, naming its file and row, before it is decoded (default 16,777,216: 4096 x 4096).",
    )
    split: str = Field("train", min_length=1, description="Dataset split to train on.")
    eval_fraction: float = Field(
        0.1, ge=0, lt=1, description="Fraction of the samples held out for evaluation (0 disables evaluation)."
    )
    train_on_prompt: bool = Field(
        False, description="Also compute loss on prompt/user tokens; by default only completions are learned."
    )
    packing: bool = Field(
        False, description="Concatenate each micro-batch's samples into one row without padding; attention stays within each sample."
    )
    max_samples: int | None = Field(None, ge=1, description="Use at most this many samples (after shuffling with the seed).")
    num_proc: int | None = Field(
        None, ge=1, le=256,
        description="Processes that tokenise the samples (datasets' map). Unset: one per core this rank may use, "
        "shared with the other ranks on the machine, and none beyond one per 20,000 samples (starting one costs more "
        "than it saves on less).",
    )
    streaming: bool = Field(
        False, description="Read and tokenise the samples as training goes, for data larger than RAM: nothing is "
        f"prepared up front or cached, samples are shuffled only within a buffer of {STREAM_SHUFFLE_BUFFER:,}, and a stream has no "
        "length, so it needs training.max_steps and data.eval_fraction: 0 (and objective.kind: sft). tuner run "
        "still checks every row first, reading the file through once a batch at a time.",
    )


class TrainingSection(Section):
    micro_batch_size: int = Field(1, ge=1, le=65536, description="Sequences per GPU per forward pass.")
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=65536, description="Micro-batches accumulated before each optimizer step."
    )
    max_seq_length: int = Field(2048, ge=8, le=4_194_304, description="Tokens per sequence; longer samples are truncated.")
    optimizer: Literal["adamw_torch", "adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit"] = Field(
        "adamw_torch",
        description="Optimizer. 8-bit variants (bitsandbytes) store moments in one byte each; paged ones spill to CPU under pressure.",
    )
    learning_rate: float = Field(2e-4, gt=0, le=10, description="Peak learning rate.")
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = Field(
        "cosine", description="Learning-rate schedule after warmup."
    )
    epochs: float = Field(1.0, gt=0, le=10000, description="Passes over the training data (ignored when max_steps is set).")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps; overrides epochs.")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warmup.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, ge=0, description="Gradient clipping norm (0 disables).")
    logging_steps: int = Field(10, ge=1, description="Log loss and speed every this many optimizer steps.")
    save_steps: int | None = Field(None, ge=1, description="Save a checkpoint every this many steps; none saves only at the end.")
    save_total_limit: int | None = Field(2, ge=1, description="Keep at most this many checkpoints (oldest are deleted).")
    eval_steps: int | None = Field(None, ge=1, description="Evaluate every this many steps; none evaluates at the end of each epoch.")
    seed: int = Field(42, ge=0, le=2**32 - 1, description="Random seed for data order, dropout and initialisation.")
    resume: PathText = Field(
        "never",
        min_length=1,
        description="never: start fresh. auto: continue from the newest complete checkpoint in the output directory. "
        "Or a checkpoint directory to continue from.",
    )
    report_to: list[Tracker] = Field(
        default_factory=list,
        description="Experiment trackers the Trainer also logs to, beside tuner's events.jsonl: tensorboard, mlflow, "
        "wandb, trackio. Each writes under the run directory unless its own environment variables say otherwise: "
        "tensorboard/ (event files), mlruns/ (MLflow file store), wandb/ (W&B offline mode), trackio/ (local "
        "database). Install each with its extra, e.g. pip install 'tuner[tensorboard]'.",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _a_list_of_distinct_trackers(cls, value):
        """``report_to: tensorboard`` means a list of one; naming a tracker twice means it once."""
        value = [value] if isinstance(value, str) else value
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return list(dict.fromkeys(value))
        return value  # anything else is for the field's type to refuse, naming it


class OutputSection(Section):
    dir: OutputFolder | None = Field(None, description="Run directory for configs, logs and checkpoints. Default: runs/<name>.")
    save: Literal["auto", "adapter", "full", "merged"] = Field(
        "auto",
        description="What the final save holds: adapter (LoRA weights only), full (all weights), merged (adapter merged "
        "into the base). auto: adapter for lora/qlora, full for full fine-tuning.",
    )


class InferenceSection(Section):
    max_new_tokens: int = Field(128, ge=1, le=1_000_000, description="Tokens to generate per answer.")
    greedy: bool = Field(False, description="Always pick the most likely token (deterministic); ignores temperature and top_p.")
    temperature: float = Field(0.7, gt=0, le=100, description="Sampling temperature.")
    top_p: float = Field(0.9, gt=0, le=1, description="Nucleus sampling: keep the smallest token set with this probability mass.")
    gpu_headroom_gb: float = Field(
        2.0, ge=0, description="GiB left free on each GPU when placing a model with device_map=auto (for activations and KV cache)."
    )
    offload_folder: OutputFolder | None = Field(None, description="Directory for weights offloaded to disk. Default: <run dir>/offload.")


class Recipe(Section):
    version: Literal[2] = Field(SCHEMA_VERSION, description="Recipe schema version (older recipes are read and migrated).")
    name: str = Field(
        "run",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Name of the run: letters, digits, '.', '_' and '-'. Names the default run directory.",
    )
    model: ModelSection = Field(default_factory=ModelSection, description="The model to train or run.")
    objective: ObjectiveSection = Field(
        default_factory=ObjectiveSection,
        description="What training optimises: SFT, preferences (DPO, KTO), rewards (GRPO) or a teacher's distributions "
        "(distillation) with TRL.")
    hardware: HardwareSection = Field(default_factory=HardwareSection, description="Machines and accelerators.")
    method: MethodSection = Field(default_factory=MethodSection, description="Full fine-tuning, LoRA or QLoRA.")
    memory: MemorySection = Field(default_factory=MemorySection, description="Memory tactics: sharding, offload, batch, precision.")
    parallelism: ParallelismSection = Field(
        default_factory=ParallelismSection,
        description="Splitting one model or one sequence across ranks: tensor (tp), context (cp) and sequence (sp) "
        "parallelism, composed with data parallelism.")
    data: DataSection = Field(default_factory=DataSection, description="Training data.")
    training: TrainingSection = Field(default_factory=TrainingSection, description="Optimisation schedule and checkpoints.")
    output: OutputSection = Field(default_factory=OutputSection, description="Where results go.")
    inference: InferenceSection = Field(default_factory=InferenceSection, description="Generation settings for infer and chat.")

    @model_validator(mode="after")
    def _resolve_defaults(self) -> "Recipe":
        """Fill in values derived from other fields so a dumped recipe states every default."""
        hw, mem = self.hardware, self.memory
        if hw.num_processes is None and (hw.gpus_per_machine == 0 or hw.machines * hw.gpus_per_machine >= 1):
            derived = hw.machines * hw.gpus_per_machine if hw.gpus_per_machine else hw.machines
            object.__setattr__(hw, "num_processes", derived)
        if self.model.dtype == "auto":
            dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(mem.mixed_precision, "float32")
            object.__setattr__(self.model, "dtype", dtype)
        if self.output.dir is None:
            object.__setattr__(self.output, "dir", f"runs/{self.name}")
        objective = self.objective
        if objective.loss_type is None and objective.kind in TRL_LOSS_TYPES:
            object.__setattr__(objective, "loss_type", TRL_LOSS_TYPES[objective.kind][0])
        if objective.beta is None and objective.kind != "reward":  # a reward model has no reference
            object.__setattr__(objective, "beta", 0.0 if objective.kind == "grpo" else DPO_DEFAULT_BETA)
        if objective.kind == "grpo":
            self._resolve_grpo()
        if objective.kind == "distill":
            self._resolve_distill()
        par = self.parallelism
        if mem.distributed == "fsdp" and (par.tp > 1 or par.cp > 1 or par.ep > 1):
            if par.dp_replicate is None:
                object.__setattr__(par, "dp_replicate", 1)
            if par.dp_shard is None:
                object.__setattr__(par, "dp_shard", max(1, self.world_size // (par.dp_replicate * par.tp * par.cp)))
        if self.output.save == "auto":
            object.__setattr__(self.output, "save", "full" if self.method.kind == "full" else "adapter")
        return self

    def _resolve_grpo(self) -> None:
        """GRPO's sizes that follow from the memory section: completion, prompt, generation rounds."""
        if self.objective.grpo is None:
            object.__setattr__(self.objective, "grpo", GrpoSection())
        grpo = self.objective.grpo
        if grpo.max_completion_length is None:
            object.__setattr__(grpo, "max_completion_length", max(1, min(512, self.training.max_seq_length // 2)))
        if grpo.max_prompt_length is None:
            object.__setattr__(grpo, "max_prompt_length", max(1, self.training.max_seq_length - grpo.max_completion_length))
        if grpo.steps_per_generation is None:
            object.__setattr__(grpo, "steps_per_generation", self.training.gradient_accumulation_steps)

    def _resolve_distill(self) -> None:
        """GKD's sample length follows from the planned sequence length."""
        if self.objective.distill is None:
            object.__setattr__(self.objective, "distill", DistillSection())
        if self.objective.distill.max_new_tokens is None:
            object.__setattr__(self.objective.distill, "max_new_tokens", max(1, min(128, self.training.max_seq_length // 2)))

    @property
    def world_size(self) -> int:
        return self.hardware.num_processes or 1

    @property
    def uses_gpu(self) -> bool:
        return self.hardware.gpus_per_machine > 0

    @property
    def uses_bitsandbytes(self) -> bool:
        """A quantised base model or an 8-bit / paged optimizer."""
        return (self.method.quantization is not None or "8bit" in self.training.optimizer
                or "paged" in self.training.optimizer)

    @property
    def data_parallel(self) -> int:
        """Ranks that each see a different batch: the world over the ranks that share one (tp x cp x sp)."""
        return max(1, self.world_size // self.parallelism.model_parallel)

    @property
    def effective_batch_size(self) -> int:
        return self.training.micro_batch_size * self.training.gradient_accumulation_steps * self.data_parallel
