"""The objective section: what the model learns (sft, dpo, kto, grpo, reward, distill), its losses, rewards and data layouts."""
from __future__ import annotations

import typing
from typing import Literal

from pydantic import Field

from tuner.recipe.section import PathText, Section

# TRL 1.16's loss variants, per trainer (DPOConfig.loss_type, KTOConfig.loss_type); "sft" is objective.sft_weight
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                  "aot_unpaired", "apo_zero", "apo_down", "discopop", "sigmoid_norm")
KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")
LOSS_TYPES = {"dpo": DPO_LOSS_TYPES, "kto": KTO_LOSS_TYPES}
PREFERENCE_OBJECTIVES = tuple(LOSS_TYPES)  # objectives trained with a TRL trainer and a reference model
# GRPOConfig.loss_type of TRL 1.16, its default (dapo) first: how the per-token losses of a batch are averaged
GRPO_LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
TRL_LOSS_TYPES = {**LOSS_TYPES, "grpo": GRPO_LOSS_TYPES}  # every objective with a loss_type, its default first
DPO_DEFAULT_BETA = 0.1
GENERATION_BACKENDS = ("transformers", "vllm_colocate", "vllm_server")
REWARD_KINDS = ("exact_match", "regex_match", "format", "length", "math", "think_format", "function", "model")


class RewardSection(Section):
    kind: Literal[REWARD_KINDS] = Field(  # type: ignore[valid-type]
        description="exact_match: 1 when the completion (stripped) equals the data column named by column, else 0. "
        "regex_match: 1 when pattern is found in the completion and its first group (or the whole match) equals "
        "the column, else 0. format: 1 when the whole completion matches pattern, else 0. length: a penalty of "
        "-(completion tokens beyond target_tokens) / max_completion_length. math: 1 when the completion's answer (its first "
        "\\boxed{} or LaTeX expression) is mathematically equal to the column's solution, else 0; none where the "
        "solution does not parse (TRL's accuracy_reward; needs the math-verify package). think_format: 1 when the "
        "completion opens with its reasoning in <think>...</think> (one of them) before the answer, else 0 (TRL's "
        "think_format_reward). function: your own Python function "
        "(function: path/to/file.py:name, next to the recipe). model: a sequence-classification reward model "
        "(model: its directory, a hub id, or the run directory of an objective.kind: reward run, whose final/ it names), scoring prompt + completion.")
    weight: float = Field(1.0, ge=-1000, le=1000, description="Weight of this reward in the sum GRPO normalises.")
    column: str | None = Field(
        None, min_length=1, description="exact_match, regex_match, math: the data column holding each prompt's expected "
        "answer (a reward input: preview shows it).")
    pattern: str | None = Field(
        None, min_length=1, description="regex_match: the regular expression that finds the answer in a completion "
        "(its first group, if any, is the answer); format: the expression a whole completion must match.")
    target_tokens: int | None = Field(
        None, ge=0, description="length: completion tokens allowed before the penalty starts (default 0).")
    function: PathText | None = Field(
        None, min_length=1, description="function: path/to/file.py:name, the path relative to the recipe's folder. "
        "The file is your own code: tuner imports it on every rank only because the recipe names it (never to "
        "validate or plan). The function is called as TRL calls reward functions, fn(prompts=, completions=, "
        "completion_ids=, **columns), and returns one number per completion.")
    model: PathText | None = Field(
        None, min_length=1, description="model: a sequence-classification checkpoint (one output, as TRL's reward "
        "models), a local directory or a hub id in the local cache, loaded in model.dtype beside the policy.")


class GrpoSection(Section):
    num_generations: int = Field(
        8, ge=2, le=1024, description="Completions sampled per prompt; their rewards are compared within the group "
        "(the group's mean is the baseline). The global generation batch must hold whole groups.")
    max_prompt_length: int | None = Field(
        None, ge=1, description="Prompts longer than this many tokens are dropped (with a count in the log). "
        "Default: max_seq_length - max_completion_length.")
    max_completion_length: int | None = Field(
        None, ge=1, description="Tokens generated per completion at most. Default: max_seq_length / 2, at most 512.")
    steps_per_generation: int | None = Field(
        None, ge=1, le=65536, description="Micro-batches trained on one generation round: each device generates "
        "micro_batch_size x steps_per_generation completions at once. Default: gradient_accumulation_steps.")
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="token: one importance ratio per token (GRPO); sequence: one per completion (GSPO).")
    temperature: float = Field(1.0, gt=0, le=100, description="Sampling temperature of the completions.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the completions (1: off).")
    generation: Literal[GENERATION_BACKENDS] = Field(  # type: ignore[valid-type]
        "transformers", description="What samples the completions: transformers (the policy's own generate, on "
        "every device: CPU and GPU); vllm_colocate (a vLLM engine inside each training process, sharing its GPU: "
        "vllm_gpu_memory_utilization of it); vllm_server (a trl vllm-serve process on vllm_server_gpus more GPUs "
        "of machine 0, started by launch.sh). vLLM needs GPUs and the vllm package.")
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, lt=1, description="vllm_colocate: the share of each GPU vLLM takes for its weights and KV cache; "
        "vllm_server: the share of the server's GPUs.")
    vllm_sleep_mode: bool = Field(
        False, description="vllm_colocate: put vLLM to sleep during the training step (its weights to CPU RAM, its "
        "KV cache freed), waking it for each generation round: less GPU memory, a transfer each way per round.")
    vllm_server_gpus: int = Field(
        1, ge=1, le=64, description="vllm_server: GPUs of machine 0 beyond gpus_per_machine that serve vLLM "
        "(its tensor-parallel size).")
    vllm_server_port: int = Field(8000, ge=1, le=65535, description="vllm_server: the server's port on machine 0.")
    rewards: list[RewardSection] = Field(
        default_factory=list, description="What each completion is scored by (at least one), summed with their "
        "weights. A reward that raises, returns the wrong number of values or something not a finite number (NaN, "
        "inf) stops the run, on every rank, naming the reward and the prompt (exit code 2).")
    reward_time_limit_s: float = Field(
        120.0, gt=0, le=86400, description="Seconds one call of a reward function (built-in or yours: it scores "
        "one rank's completions of a generation round) may take; a call still running then stops the run on every "
        "rank, naming the reward (exit code 2).")


class DistillSection(Section):
    """GKD's settings (TRL's GKDConfig): where the sequences come from and which divergence the student minimises."""

    on_policy: float = Field(
        0.0, ge=0, le=1, description="Share of the steps trained on sequences the student samples itself from each "
        "prompt (GKD's lmbda): 0 is off-policy distillation (the teacher's logits on the data's own completions), 1 "
        "fully on-policy (the teacher scores the student's own samples, as in the GKD paper).")
    beta: float = Field(
        0.5, ge=0, le=1, description="The divergence between the teacher's and the student's next-token "
        "distributions (GKD's generalised Jensen-Shannon beta): 0 forward KL(teacher || student), 1 reverse KL, "
        "0.5 the Jensen-Shannon divergence.")
    temperature: float = Field(0.9, gt=0, le=100, description="Sampling temperature of the on-policy samples.")
    max_new_tokens: int | None = Field(
        None, ge=1, description="Tokens the student (or, with sequence_level, the teacher) samples per prompt at "
        "most. Default: max_seq_length / 2, at most 128 (GKD's default).")
    sequence_level: bool = Field(
        False, description="On the steps not trained on-policy, train on the teacher's own samples (sequence-level "
        "KD, GKD's seq_kd) instead of the data's completions.")


class ObjectiveData(typing.NamedTuple):
    """What an objective trains on: the data layouts it reads (data.format auto detects among them, the first when
    it reads one) and a built-in data source to try it on (None: none yet)."""

    formats: tuple[str, ...]
    example: str | None


# every objective.kind (a test holds them to the Literal below), each data.format but auto read by at least one
OBJECTIVE_DATA = {"sft": ObjectiveData(("text", "instruction", "chat", "image_prompt_answer", "image_chat"),
                                        "builtin:reverse"),
                  "dpo": ObjectiveData(("preference",), "builtin:reverse-pairs"),
                  "kto": ObjectiveData(("unpaired_preference",), None),
                  "grpo": ObjectiveData(("prompt",), "builtin:reverse-prompts"),
                  "reward": ObjectiveData(("preference",), "builtin:reverse-pairs"),
                  # the completions of SFT's layouts, scored by the teacher (the prompts are what on-policy samples from)
                  "distill": ObjectiveData(("instruction", "chat"), "builtin:reverse")}


class ObjectiveSection(Section):
    kind: Literal["sft", "dpo", "kto", "grpo", "reward", "distill"] = Field(
        "sft",
        description="What the model learns. sft: the completions of the data (transformers Trainer). dpo: to prefer "
        "each pair's chosen answer to its rejected one, relative to the starting model (TRL DPOTrainer). kto: to "
        "raise desirable and lower undesirable completions (TRL KTOTrainer). dpo and kto start from model.id, "
        "usually an SFT result, which also serves as the frozen reference. grpo: online RL (TRL GRPOTrainer): "
        "completions sampled for each prompt are scored by objective.grpo.rewards and the better ones made likelier. "
        "reward: a reward model (TRL RewardTrainer): a one-output sequence-classification head on model.id, trained "
        "to score each pair's chosen answer above its rejected one; its held-out pair accuracy is reported, and its "
        "run directory serves a grpo recipe as rewards: [{kind: model, model: <run dir>}]. "
        "distill: the student (model.id) learns the next-token distributions of objective.teacher, which shares its "
        "tokenizer (TRL GKDTrainer), on the data's completions or its own samples (objective.distill.on_policy).",
    )
    teacher: PathText | None = Field(
        None, min_length=1, description="distill: the teacher model, named as model.id is (a local directory, a hub id "
        "in the local cache, a built-in model): loaded frozen in model.dtype beside the student, on the same devices "
        "(sharded with it under ZeRO-3 or FSDP). It must share the student's tokenizer.")
    beta: float | None = Field(
        None, ge=0, le=1000,
        description=f"dpo/kto: how far the policy may move from the reference (higher stays closer; above 0), ipo's "
        f"tau; default {DPO_DEFAULT_BETA}. grpo: the weight of the KL penalty to the starting model; 0 (the default, "
        "TRL's) loads no reference model.",
    )
    loss_type: Literal[DPO_LOSS_TYPES + KTO_LOSS_TYPES + GRPO_LOSS_TYPES] | None = Field(  # type: ignore[valid-type]
        None,
        description="dpo: sigmoid (DPO), hinge, ipo, exo_pair, nca_pair, robust, bco_pair, sppo_hard, aot, "
        "aot_unpaired, apo_zero, apo_down, discopop or sigmoid_norm; kto: kto or apo_zero_unpaired; grpo: dapo, "
        "grpo, dr_grpo, bnpo, cispo, sapo, luspo or vespo. Default: sigmoid for dpo, kto for kto, dapo for grpo.",
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5,
        description="dpo: probability that a pair's preference is flipped (robust, aot) or EXO's epsilon (exo_pair, needs > 0).",
    )
    sft_weight: float = Field(
        0.0, ge=0, le=1000,
        description="dpo: add this weight times the NLL of the chosen answers to the loss (RPO; TRL loss_type "
        "[<loss_type>, sft]). 0: the preference loss alone.",
    )
    precompute_ref_log_probs: bool = Field(
        False,
        description="dpo/kto: compute the reference log-probabilities of every sample in one pass before training, "
        "so full fine-tuning keeps no reference copy of the model while it trains.",
    )
    desirable_weight: float = Field(1.0, gt=0, le=1000, description="kto: weight of the desirable (label true) losses.")
    undesirable_weight: float = Field(
        1.0, gt=0, le=1000, description="kto: weight of the undesirable (label false) losses.")
    grpo: GrpoSection | None = Field(
        None, description="grpo: generation, rewards and the rollout's sizes (filled in with its defaults for grpo).")
    distill: DistillSection | None = Field(
        None, description="distill: on- or off-policy, the divergence, the samples' sizes (filled in with its "
        "defaults for distill).")

    @property
    def preference(self) -> bool:
        """Trained on preferences with a reference model (dpo, kto), not on completions (sft)."""
        return self.kind in PREFERENCE_OBJECTIVES

    @property
    def reference_model(self) -> bool:
        """The objective compares the policy with the starting model: dpo, kto, and grpo with a KL penalty."""
        return self.preference or (self.kind == "grpo" and bool(self.beta))
