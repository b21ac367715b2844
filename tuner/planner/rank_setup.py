"""The recipe reduced to what the memory model reads, for one rank: its share of the model under tensor
parallelism, the parameters it holds, the kernels and settings the run will use."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tuner.catalog.facts import ModelFacts, ParamCounts
from tuner.catalog.models import model_facts
from tuner.planner.distill import teacher_of
from tuner.planner.expert_parallel import expert_share
from tuner.planner.grpo import rollout_of
from tuner.planner.items import DTYPE_BYTES
from tuner.planner.kernels import kernels
from tuner.planner.preference import sequences_per_sample
from tuner.planner.tower import has_image_data, tower_of


@dataclass(frozen=True)
class Setup:
    """The recipe reduced to what the memory model reads, for one rank."""

    facts: ModelFacts  # one tensor-parallel rank's share of a decoder layer (the model's own shape when tp is 1)
    model: ModelFacts  # the whole model (loading, saving and merging handle it whole)
    counts: ParamCounts  # the parameters one rank holds before ZeRO/FSDP sharding (the model's when tp is 1)
    kind: str  # full, lora, qlora
    weight_bytes: int  # model.dtype
    act_bytes: int  # activations: 16-bit under mixed precision, else the weights' dtype
    mixed: bool
    distributed: str
    zero: int | None
    fsdp: str
    world: int
    shard_group: int  # FSDP: the ranks a parameter is sharded across
    zero_ranks: int  # DeepSpeed: the ranks ZeRO partitions across (all but the tensor-parallel ones)
    offload_optimizer: str
    offload_params: str
    checkpointing: bool
    eager: bool
    flash: bool
    batch: int
    seq: int  # tokens of one sequence on one rank: max_seq_length over the cp x sp ranks that split it
    accumulation: int
    optimizer: str
    lora_r: int
    lora_targets: object
    lora_parameters: tuple[str, ...]
    lora_dropout: float
    quant_bits: int | None
    double_quant: bool
    on_gpu: bool
    gpus_per_machine: int
    liger: bool  # Liger's kernels are used: requested and on a GPU (the training entrypoint ignores them on the CPU)
    chunked_loss: bool
    activation_offloading: bool
    packing: bool
    evaluates: bool
    resumable: bool  # checkpoints are saved during training, or the run resumes: plan the resume
    save: str  # output.save
    fsdp_full_state_dict: bool
    fsdp_ram_efficient_loading: bool
    objective: str = "sft"  # sft, a preference objective (tuner.planner.preference) or grpo (tuner.planner.grpo)
    precompute: bool = False  # preference: reference log-probabilities computed before training
    reference: bool = False  # a reference model is compared with: dpo, kto, grpo with beta > 0
    rollout: object = None  # grpo: tuner.planner.grpo.Rollout
    teacher: object = None  # distill: tuner.planner.distill.Teacher
    tp: int = 1  # tensor-parallel ranks (parallelism.tp)
    experts: object = None  # ep > 1: tuner.planner.expert_parallel.ExpertShare, the experts this rank holds
    seq_shards: int = 1  # ranks a sequence is split across: cp (ring attention) or sp (Ulysses)
    modules_to_save: tuple[str, ...] = ()  # method.lora.modules_to_save: trained in full beside the adapters
    train: tuple[str, ...] = ("language_model",)  # method.train: the parts of an image-text model that train
    images: bool = False  # an image-text model whose data rows carry images (one a row)
    tower: object = None  # then its vision tower, where modelled: tuner.planner.tower.Tower
    logprob_fold: str | None = None  # dpo/kto: how TRL's fused head folds its tiles (tuner.planner.kernels)
    kernel_notes: tuple[str, ...] = ()  # the kernels the plan assumes, and why (tuner.planner.kernels)

    @property
    def held_weight_bytes(self) -> int:
        """Bytes of an unquantised parameter as the run holds it: a DeepSpeed bf16/fp16 engine casts every floating
        parameter, frozen ones too, to its 16-bit dtype (``_cast_module_mixed_precision``) `[zero]`; else
        model.dtype."""
        return 2 if self.distributed == "deepspeed" and self.zero is not None and self.mixed else self.weight_bytes

    @property
    def tp_label(self) -> str:
        """' (tp 1/8)' after an item one tensor-parallel rank holds a share of; '' without tensor parallelism."""
        return f" (tp 1/{self.tp})" if self.tp > 1 else ""


def rank_facts(model: ModelFacts, tp: int) -> ModelFacts:
    """One tensor-parallel rank's share of a decoder layer: transformers' plans and DeepSpeed AutoTP split q/k/v and
    gate/up by output columns and o/down by input rows, so a rank holds heads / tp, KV heads / tp and an MLP width
    / tp; the hidden width, the norms (and Qwen 3's q/k norms) and a MoE's router stay whole on every rank."""
    if tp == 1:
        return model
    return replace(model, tp=tp, num_heads=model.num_heads // tp, num_kv_heads=max(1, model.num_kv_heads // tp),
                   intermediate_size=model.intermediate_size // tp)


def rank_param_counts(model: ModelFacts, tp: int, distributed: str) -> ParamCounts:
    """The parameters one tensor-parallel rank holds: its share of every decoder layer (:func:`rank_facts`), and
    the output head and embeddings as the backend splits them.  DeepSpeed AutoTP (deepspeed) splits the output
    head by vocabulary and a tied embedding with it, and leaves an untied one whole (traced on two ranks:
    tests/test_rank_memory.py); transformers' plan (fsdp) splits an untied head by vocabulary and leaves the
    embeddings, and a head tied to them, whole."""
    counts = rank_facts(model, tp).param_counts
    if tp == 1:
        return counts
    if distributed == "deepspeed":
        embeddings = math.ceil(counts.embeddings / tp) if model.tie_word_embeddings else counts.embeddings
        return replace(counts, embeddings=embeddings, lm_head=math.ceil(counts.lm_head / tp))
    return replace(counts, lm_head=math.ceil(counts.lm_head / tp))


def rank_setup(recipe) -> Setup:
    mem, method = recipe.memory, recipe.method
    quant = method.quantization
    weight_bytes = DTYPE_BYTES[recipe.model.dtype]
    mixed = mem.mixed_precision != "no"
    world = recipe.world_size
    objective = recipe.objective
    par = recipe.parallelism
    model = model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code)
    if mem.distributed == "fsdp" and (par.model_parallel > 1 or par.ep > 1):  # Accelerate's dp_shard_cp mesh: cp
        # ranks shard too; transformers' fsdp mesh under ep
        shard_group = par.dp_shard * par.cp
    elif mem.fsdp.sharding_strategy == "hybrid_shard":
        shard_group = min(world, recipe.hardware.gpus_per_machine)
    else:
        shard_group = world
    chosen = kernels(recipe, model.model_type)
    images = model.inventory is not None and bool(model.inventory.parts) and has_image_data(recipe)
    counts = rank_param_counts(model, par.tp, mem.distributed)
    if objective.kind == "reward":
        from tuner.planner.reward import reward_counts

        counts = reward_counts(model, counts)
    return Setup(
        facts=rank_facts(model, par.tp), model=model, counts=counts,
        tp=par.tp, seq_shards=par.cp * par.sp,
        experts=expert_share(model, par.ep, par.dp_shard or 1, par.tp),
        # ZeRO partitions across DeepSpeed's sequence-data-parallel group: every rank but the tensor-parallel ones
        zero_ranks=max(1, world // par.tp),
        kind=method.kind, weight_bytes=weight_bytes, act_bytes=2 if mixed else weight_bytes, mixed=mixed,
        distributed=mem.distributed, zero=mem.zero_stage, fsdp=mem.fsdp.sharding_strategy, world=world,
        shard_group=shard_group,
        offload_optimizer=mem.offload_optimizer, offload_params=mem.offload_params,
        checkpointing=mem.gradient_checkpointing, eager=chosen.attention == "eager", flash=chosen.attention == "flash",
        batch=recipe.training.micro_batch_size * sequences_per_sample(objective.kind),
        # grpo's sequences are a prompt and a completion, each at most its length
        seq=(objective.grpo.max_prompt_length + objective.grpo.max_completion_length if objective.grpo else
             recipe.training.max_seq_length) // (par.cp * par.sp),
        accumulation=recipe.training.gradient_accumulation_steps, optimizer=recipe.training.optimizer, lora_r=method.lora.r,
        lora_targets=method.lora.target_modules, lora_parameters=tuple(method.lora.target_parameters),
        lora_dropout=0.0 if objective.kind != "sft" else method.lora.dropout,  # TRL turns dropout off
        quant_bits=quant.bits if quant and method.kind == "qlora" else None,
        double_quant=bool(quant and quant.double_quant), on_gpu=recipe.uses_gpu,
        gpus_per_machine=recipe.hardware.gpus_per_machine, liger=chosen.liger,
        chunked_loss=mem.chunked_loss, activation_offloading=mem.activation_offloading and mem.gradient_checkpointing,
        packing=recipe.data.packing, evaluates=recipe.data.eval_fraction > 0, save=recipe.output.save,
        resumable=recipe.training.save_steps is not None or recipe.training.resume != "never",
        fsdp_full_state_dict=mem.fsdp.state_dict_type == "full",
        # distill trains on SFT's sequences with full logits (no TRL fused head): planned as sft, plus its teacher
        fsdp_ram_efficient_loading=mem.fsdp.cpu_ram_efficient_loading,
        objective="sft" if objective.kind == "distill" else objective.kind, teacher=teacher_of(recipe),
        precompute=objective.precompute_ref_log_probs, reference=objective.reference_model,
        rollout=rollout_of(recipe) if objective.grpo else None, logprob_fold=chosen.logprob_fold,
        kernel_notes=chosen.notes, modules_to_save=tuple(method.lora.modules_to_save) if method.kind != "full" else (),
        train=tuple(method.train), images=images, tower=tower_of(model.inventory, recipe) if images else None,
    )
