"""Cross-field rules about the objective: its data layouts, its losses, GRPO's generation, reward models and streamed
data."""
from __future__ import annotations

from tuner.recipe.model_checks import remote_code_problem
from tuner.recipe.objective import GRPO_LOSS_TYPES, LOSS_TYPES, OBJECTIVE_DATA
from tuner.recipe.problem import Problem
from tuner.recipe.schema import Recipe


# the data layouts each objective reads (auto detects among them), from the schema
OBJECTIVE_FORMATS = {kind: data.formats for kind, data in OBJECTIVE_DATA.items()}


def _objective(recipe: Recipe) -> list[Problem]:
    objective, data = recipe.objective, recipe.data
    kind = objective.kind
    problems = []
    if data.format != "auto" and data.format not in OBJECTIVE_FORMATS[kind]:
        wanted = " or ".join(OBJECTIVE_FORMATS[kind])
        owner = next(name for name, formats in OBJECTIVE_FORMATS.items() if data.format in formats)
        problems.append(Problem(
            "data.format", f"objective {kind} reads {wanted} data, not {data.format}: set data.format to {wanted} "
                           f"(or auto), or set objective.kind: {owner}."))
    if kind == "reward":
        return problems + _reward(recipe)
    if not objective.preference:
        if objective.loss_type is not None and kind == "sft":
            problems.append(Problem(
                "objective.loss_type", "loss_type is a dpo/kto/grpo setting: remove it, or set objective.kind: dpo, "
                                       "kto or grpo."))
        return problems
    if objective.beta == 0:
        problems.append(Problem("objective.beta", f"{kind} measures how far the policy moved from the reference "
                                                  f"with beta: set it above 0 (e.g. 0.1)."))
    if objective.loss_type not in LOSS_TYPES[kind]:
        problems.append(Problem(
            "objective.loss_type",
            f"{objective.loss_type} is not a {kind} loss; use one of {', '.join(LOSS_TYPES[kind])}."))
    if objective.loss_type == "exo_pair" and objective.label_smoothing == 0:
        problems.append(Problem("objective.label_smoothing", "exo_pair needs label_smoothing above 0 (the EXO paper uses 1e-3).",
                                anchor="objective.loss_type"))
    if objective.sft_weight and kind != "dpo":
        problems.append(Problem("objective.sft_weight", "sft_weight adds the chosen answers' NLL to a dpo loss; "
                                                        "remove it, or set objective.kind: dpo."))
    if kind == "kto" and objective.loss_type == "kto" and recipe.training.micro_batch_size < 2:
        problems.append(Problem(
            "training.micro_batch_size",
            "KTO estimates its KL term from the other samples of a micro-batch: set micro_batch_size to 2 or more "
            "(or loss_type: apo_zero_unpaired, which has no KL term).", anchor="objective.kind"))
    if data.packing:
        problems.append(Problem(
            "data.packing", f"{kind} pads each micro-batch (TRL 1.16 turns padding_free off): set packing: false."))
    if data.train_on_prompt:
        problems.append(Problem(
            "data.train_on_prompt", f"{kind} compares the completions only: set train_on_prompt: false."))
    return problems


def _streaming(recipe: Recipe) -> list[Problem]:
    """A stream (data.streaming) has no length: nothing can be counted, split off or prepared whole up front."""
    data = recipe.data
    if not data.streaming:
        return []
    problems = []
    if recipe.training.max_steps is None:
        problems.append(Problem(
            "training.max_steps", "a stream has no length, so epochs cannot be counted: set max_steps (optimizer "
            "steps to train for), or data.streaming: false.", anchor="data.streaming"))
    if data.eval_fraction > 0:
        problems.append(Problem(
            "data.eval_fraction", "a stream has no length to hold a fraction of out: set eval_fraction: 0, or "
            "data.streaming: false to evaluate on held-out samples.", anchor="data.streaming"))
    if data.num_proc and data.num_proc > 1:
        problems.append(Problem(
            "data.num_proc", "a stream is tokenised by each rank as training reads it, not by a pool of processes "
            "up front: remove num_proc, or set data.streaming: false.", anchor="data.streaming"))
    if recipe.parallelism.model_parallel > 1:
        problems.append(Problem(
            "data.streaming", "a stream is read by each rank for its own batches (tested with data parallelism), but "
            "tensor-, context- and sequence-parallel ranks must share theirs: set streaming: false, or tp, cp and sp "
            "to 1."))
    if recipe.objective.preference or recipe.objective.kind == "reward":
        problems.append(Problem(
            "data.streaming", f"{recipe.objective.kind} trains on a dataset TRL's trainer tokenises whole before the "
            "first step, not on a stream: set streaming: false, or objective.kind: sft."))
    return problems


DPO_KTO_FIELDS = {"label_smoothing": 0.0, "sft_weight": 0.0, "precompute_ref_log_probs": False,
                  "desirable_weight": 1.0, "undesirable_weight": 1.0}  # and their defaults


def _reward(recipe: Recipe) -> list[Problem]:
    """A reward model (TRL's RewardTrainer): its one loss has no setting of the other objectives, it reads pairs
    padded per micro-batch, and its head has no vocabulary logits to chunk."""
    objective, data = recipe.objective, recipe.data
    problems = []
    if objective.loss_type is not None:
        problems.append(Problem("objective.loss_type", "reward trains with one loss, -log sigmoid(chosen score - "
                                                       "rejected score): remove loss_type."))
    if objective.beta is not None:
        problems.append(Problem("objective.beta", "beta is a dpo/kto/grpo setting (a reward model has no reference "
                                                  "to stay near): remove it."))
    for field, default in DPO_KTO_FIELDS.items():
        if getattr(objective, field) != default:
            problems.append(Problem(f"objective.{field}", f"{field} is a dpo/kto setting: remove it, or set "
                                                          "objective.kind: dpo or kto."))
    for field, why in (("packing", "pads each micro-batch of chosen and rejected sequences (TRL packs nothing)"),
                       ("train_on_prompt", "scores whole sequences; no token is learned")):
        if getattr(data, field):
            problems.append(Problem(f"data.{field}", f"reward {why}: set {field}: false."))
    if recipe.memory.chunked_loss:
        problems.append(Problem("memory.chunked_loss", "a reward head scores each sequence with one number, no "
                                                       "vocabulary logits to chunk: set chunked_loss: false."))
    if recipe.parallelism.model_parallel > 1:
        problems.append(Problem("parallelism", "reward is trained with data parallelism here (tp, cp and sp are not "
                                               "tested with TRL's RewardTrainer): set tp, cp and sp to 1."))
    if recipe.method.kind != "full" and recipe.output.save in ("merged", "full"):
        problems.append(Problem("output.save", "a reward model's adapter is saved with its trained head "
                                               "(output.save: adapter); merging it is not supported: set save: "
                                               "adapter, or method.kind: full."))
    return problems


def _grpo(recipe: Recipe) -> list[Problem]:
    """grpo's sizes (whole groups in every generation round, prompt + completion within the planned length), its
    rewards, its generation backend, and the settings of other objectives or tactics it cannot use."""
    from tuner.recipe.rewards import reward_problems

    objective, mem, data = recipe.objective, recipe.memory, recipe.data
    if objective.kind != "grpo":
        return [Problem("objective.grpo", "objective.grpo holds grpo settings: remove it, or set objective.kind: "
                                          "grpo.")] if objective.grpo is not None else []
    grpo, problems = objective.grpo, []
    for field, default in DPO_KTO_FIELDS.items():
        if getattr(objective, field) != default:
            problems.append(Problem(f"objective.{field}", f"{field} is a dpo/kto setting: remove it, or set "
                                                          "objective.kind: dpo or kto."))
    if objective.loss_type not in GRPO_LOSS_TYPES:
        problems.append(Problem("objective.loss_type", f"{objective.loss_type} is not a grpo loss; use one of "
                                                       f"{', '.join(GRPO_LOSS_TYPES)}."))
    prompt, completion = grpo.max_prompt_length, grpo.max_completion_length
    if prompt + completion > recipe.training.max_seq_length:
        problems.append(Problem(
            "objective.grpo.max_completion_length", f"max_prompt_length + max_completion_length = {prompt} + "
            f"{completion} = {prompt + completion} tokens, more than training.max_seq_length ({recipe.training.max_seq_length}), "
            "which the memory plan is made for: lower one of them, or raise max_seq_length.",
            anchor="objective.grpo"))
    groups, ranks = grpo.num_generations, recipe.data_parallel
    round_size = recipe.training.micro_batch_size * ranks * grpo.steps_per_generation
    if round_size % groups:
        problems.append(Problem(
            "objective.grpo.num_generations", f"a generation round samples micro_batch_size x data-parallel ranks x "
            f"steps_per_generation = {recipe.training.micro_batch_size} x {ranks} x {grpo.steps_per_generation} = {round_size} "
            f"completions, which must be whole groups of num_generations ({groups}): make num_generations divide "
            f"{round_size}, or change micro_batch_size or steps_per_generation.", anchor="objective.grpo"))
    elif data.eval_fraction > 0 and (recipe.training.micro_batch_size * ranks) % groups:
        problems.append(Problem(
            "training.micro_batch_size", f"evaluation samples micro_batch_size x data-parallel ranks = "
            f"{recipe.training.micro_batch_size * ranks} completions at a time, which must be whole groups of num_generations "
            f"({groups}): make it a multiple of {groups}, or set data.eval_fraction: 0.", anchor="objective.grpo"))
    if not grpo.rewards:
        problems.append(Problem("objective.grpo.rewards", "grpo scores completions with rewards: add at least one, "
                                                          "e.g. rewards: [{kind: exact_match, column: answer}].",
                                anchor="objective.grpo"))
    for index, reward in enumerate(grpo.rewards):
        for field, message in reward_problems(reward):
            problems.append(Problem(f"objective.grpo.rewards.{index}.{field}", message,
                                    anchor=f"objective.grpo.rewards.{index}"))
        if reward.kind == "model":
            problem = remote_code_problem(reward.model, None, recipe.model.trust_remote_code)
            if problem:
                problems.append(Problem(f"objective.grpo.rewards.{index}.model", problem))
    vllm = grpo.generation != "transformers"
    if vllm and not recipe.uses_gpu:
        problems.append(Problem("objective.grpo.generation", f"{grpo.generation} runs vLLM, which needs CUDA GPUs: "
                                                             "set hardware.gpus_per_machine, or generation: "
                                                             "transformers."))
    if grpo.vllm_sleep_mode and grpo.generation != "vllm_colocate":
        problems.append(Problem("objective.grpo.vllm_sleep_mode", "sleep mode frees the GPU memory of a vLLM engine "
                                                                  "inside the training process: set generation: "
                                                                  "vllm_colocate, or vllm_sleep_mode: false."))
    for field, why in (("packing", "pads its completions (TRL's GRPOTrainer packs nothing)"),
                       ("train_on_prompt", "learns from its completions only"),
                       ("streaming", "samples its prompts from a dataset TRL indexes (its RepeatSampler)")):
        if getattr(data, field):
            problems.append(Problem(f"data.{field}", f"grpo {why}: set {field}: false."))
    if recipe.parallelism.model_parallel > 1:
        problems.append(Problem("parallelism", "grpo is trained with data parallelism here: TRL 1.16's GRPOTrainer "
                                               "refuses cp and sp, and tp is not tested with it: set tp, cp and sp "
                                               "to 1."))
    if mem.chunked_loss:
        problems.append(Problem("memory.chunked_loss", "TRL's fused log-prob head already builds no full logits for "
                                                       "grpo: set chunked_loss: false."))
    return problems
