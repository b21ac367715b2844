"""Simulate one training step on fake tensors: the real model code, no memory allocated.

The model is built from its config as fake tensors; an AdamW step on zero gradients
creates the optimizer states, then one Trainer-like step (forward with autocast, backward,
gradient clipping, AdamW step, zero_grad) runs in that steady state under
``torch.distributed._tools.mem_tracker.MemTracker``, which records the peak of live tensor
storage by category.  This checks the analytic planner; it is slow (seconds), so only
``tuner plan --simulate`` and the tests call it.  torch and transformers are imported here only.

For dpo and kto the step is the tensor path of TRL's ``_compute_loss``: dropout off, TRL's fused LM head (per-token
log-probabilities in tiles, no full logits), the policy's forward on the micro-batch (dpo: its chosen and rejected
sequences stacked), the reference's forward under ``no_grad`` (a frozen copy for full fine-tuning, the adapter
disabled for LoRA, none when precomputed), the loss on per-sequence sums; not the metric logging, whose ``.item()``
fake tensors cannot answer.

For grpo (:func:`simulate_grpo`) one round is traced in two parts, each with its own peak: **generation** -- the
prompts' prefill into transformers' DynamicCache, max_completion_length decoding steps through the same logits
processors ``generate`` uses (temperature, top-p), softmax and multinomial sampling (``generate`` itself stops on
data it cannot see in fake tensors), then the reference's and the old policy's log-probabilities in chunks through
TRL's fused head -- and the **training step** on one micro-batch: the policy's fused forward on prompt + completion
(log-probabilities and entropy), TRL's clipped loss with the KL term, backward, clipping, AdamW.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from tuner.loading.chunked_loss import enable_chunked_loss
from tuner.loading.image_batch import has_image_rows, image_batch, image_tower, tower_traceable
from tuner.loading.model import build_on_meta
from tuner.loading.objective_steps import distill_step, preference_step, prepare_like_trl, reward_step, teacher_recipe
from tuner.planner.items import GENERATION, GIB, TRAINING_STEP

CPU_TRACE = "a CPU trace cannot run flash-attn"  # the attention is chosen as on a machine without it

_CATEGORY = {"Parameter": "weights", "Buffer": "weights", "Gradient": "gradients", "Optstate": "optimizer",
             "Activation": "activations", "Temp": "backward temporaries", "Other": "other"}


@dataclass
class SimulationResult:
    peak_gib: float = 0.0
    peak_by_category: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # why the step could not be simulated
    phases_gib: dict[str, float] = field(default_factory=dict)  # grpo: the peak of each traced phase

    def to_dict(self) -> dict:
        return {"units": "GiB (2^30 bytes)", "peak_gib": round(self.peak_gib, 4),
                "peak_by_category_gib": {k: round(v, 4) for k, v in self.peak_by_category.items()},
                "phases_gib": {k: round(v, 4) for k, v in self.phases_gib.items()},
                "seconds": round(self.seconds, 2), "notes": self.notes, "error": self.error}


def why_not_simulable(recipe) -> str | None:
    mem = recipe.memory
    if recipe.method.kind == "qlora":
        return "bitsandbytes 4/8-bit layers run CUDA kernels that fake tensors cannot execute"
    if "8bit" in recipe.training.optimizer or "paged" in recipe.training.optimizer:
        return f"the bitsandbytes optimizer {recipe.training.optimizer} runs CUDA kernels that fake tensors cannot execute"
    if mem.distributed in ("deepspeed", "fsdp") and (recipe.world_size > 1 or mem.distributed == "fsdp" or mem.zero_stage):
        return "ZeRO/FSDP sharding and offload need a process group and their engines; only a single process is simulated"
    grpo = recipe.objective.grpo
    if grpo is not None and grpo.generation != "transformers":
        return "vLLM generates in its own engine, which fake tensors cannot run"
    if has_image_rows(recipe) and image_tower(recipe) is None:
        return ("an image batch is built for the towers the planner models only (LLaVA, Gemma 3, Qwen2-VL, "
                "Qwen2.5-VL, Qwen3-VL, Llama 4, Idefics 3 / SmolVLM)")
    inventory = _inventory(recipe)
    if has_image_rows(recipe) and inventory.model_type == "qwen3_vl":
        return ("Qwen3-VL's language model adds the deepstack features at the image tokens by a boolean index "
                "(hidden_states[visual_pos_masks]), whose size fake tensors cannot know; its tower is traced alone "
                "(tests/test_tower_memory.py)")
    if inventory is not None and inventory.parts and inventory.model_type == "llama4":
        return ("Llama4ForConditionalGeneration's forward cannot finish a step in transformers 5.24 (it reads "
                "outputs.image_outputs, which its language model's output lacks); its tower is traced alone "
                "(tests/test_tower_memory.py)")
    if grpo is not None and any(reward.kind == "model" for reward in grpo.rewards):
        return "a reward model's forward is not traced (its checkpoint is read only by the training run)"
    return None


def _inventory(recipe):
    from tuner.catalog.models import model_facts

    return model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code).inventory


@contextmanager
def _grouped_mm_traceable():
    """torch's meta kernel of ``_grouped_mm`` accepts bf16 only, so fake tensors of other dtypes take transformers'
    own fallback op (``transformers::grouped_mm_fallback``), which saves the same input and weight for backward."""
    import torch
    from transformers.integrations import moe

    original = moe._can_use_grouped_mm
    moe._can_use_grouped_mm = lambda inputs, weight, offs: weight.dtype == torch.bfloat16 and original(inputs, weight,
                                                                                                         offs)
    try:
        yield
    finally:
        moe._can_use_grouped_mm = original


class _NoHook:
    def remove(self) -> None:
        pass


def frozen_aware_tracker():
    """A MemTracker that leaves frozen parameters (LoRA's base weights) without gradient hooks."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class FrozenAwareMemTracker(MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            for param in module.parameters():
                if not param.requires_grad:  # register_hook would raise on it; it never gets a gradient
                    self._param_to_grad_hook_handles.setdefault(param, (_NoHook(), _NoHook()))
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    return FrozenAwareMemTracker()


def _tie_weights(model) -> None:
    """Tie the embeddings and the head again after ``to_empty``, as loading had them: where PEFT wraps one of them
    (modules_to_save), the frozen originals share the weight and the trained copy stays apart."""
    from peft.utils import ModulesToSaveWrapper

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inputs, head = base.get_input_embeddings(), base.get_output_embeddings()
    if not isinstance(inputs, ModulesToSaveWrapper) and not isinstance(head, ModulesToSaveWrapper):
        model.tie_weights()
    elif getattr(base.config.get_text_config(), "tie_word_embeddings", False):
        original = lambda module: getattr(module, "original_module", module)  # noqa: E731
        original(head).weight = original(inputs).weight


def _snapshot_gib(tracker) -> tuple[float, dict[str, float]]:
    """The tracker's peak: the total and by category, in GiB."""
    by_category: dict[str, float] = {}
    total = 0.0
    for device_snapshot in tracker.get_tracker_snapshot("peak").values():
        for key, value in device_snapshot.items():
            name = getattr(key, "value", key)
            if name == "Total":
                total += value
                continue
            category = _CATEGORY.get(name, name)
            by_category[category] = by_category.get(category, 0.0) + value / GIB
    return total / GIB, {k: v for k, v in by_category.items() if v}


def _optimizer_with_states(model):
    """The trainable parameters and their AdamW (the CPU's single-tensor loop), its states made by a step on zero
    gradients: without paying for a first forward/backward."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=False)
    for param in trainable:
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return trainable, optimizer


def _autocast_dtype(recipe):
    """The dtype the Trainer autocasts to under the recipe's mixed precision, or None."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(recipe.memory.mixed_precision)


def _built(recipe):
    """The policy as training builds it (:func:`tuner.loading.model.build_on_meta`: its class, attention, the one
    LoRA config with its modules_to_save), and a frozen reference copy for full fine-tuning with a KL penalty, on
    meta (PEFT cannot move fake tensors, so build on meta and materialise as fakes); and the vocabulary size."""
    model = build_on_meta(recipe, layers=None, flash_missing=CPU_TRACE)
    reference = None
    if recipe.objective.reference_model and recipe.method.kind == "full" and \
            not recipe.objective.precompute_ref_log_probs:
        reference = build_on_meta(recipe, layers=None, flash_missing=CPU_TRACE)
    if recipe.objective.kind == "distill":  # the teacher, frozen like a reference
        reference = build_on_meta(teacher_recipe(recipe), layers=None, flash_missing=CPU_TRACE)
    return model, reference, model.config.get_text_config().vocab_size


def _materialised(model, reference):
    """The models as fake tensors (inside FakeTensorMode), ties restored, the reference frozen."""
    model = model.to_empty(device="cpu")
    _tie_weights(model)  # to_empty gives each module its own tensor; tied embeddings share one again
    if reference is not None:
        reference = reference.to_empty(device="cpu")
        reference.tie_weights()
        reference.requires_grad_(False)
        reference.eval()
    return model, reference


def grpo_round(policy, reference, recipe, vocab: int, trained=None):
    """Root modules for the two traced parts of a grpo round: generating and scoring (no gradients) with ``policy``,
    and the loss on one micro-batch through ``trained`` (the policy wrapped by DDP or DeepSpeed; default: itself)."""
    import contextlib

    import torch
    from transformers import DynamicCache
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopPLogitsWarper,
    )

    grpo, objective = recipe.objective.grpo, recipe.objective
    batch, prompt, completion = recipe.training.micro_batch_size, grpo.max_prompt_length, grpo.max_completion_length
    round_size = batch * grpo.steps_per_generation
    processors = LogitsProcessorList(
        ([TemperatureLogitsWarper(grpo.temperature)] if grpo.temperature != 1.0 else [])
        + ([TopPLogitsWarper(grpo.top_p)] if grpo.top_p < 1.0 else []))
    old_log_probs = recipe.training.gradient_accumulation_steps % grpo.steps_per_generation != 0

    def log_probs(model, ids, no_adapter: bool = False):
        labels = ids.clone()
        labels[:, :prompt] = -100  # only the completion is scored (the CPU head scores every position anyway)
        disabled = model.disable_adapter() if no_adapter else contextlib.nullcontext()
        with disabled:
            return model(input_ids=ids, labels=labels, fused_lm_head=True, use_cache=False)

    class Generation(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.policy, self.reference = policy, reference

        def forward(self, prompts):
            cache = DynamicCache()
            out = self.policy(input_ids=prompts, cache=cache, use_cache=True, logits_to_keep=1)
            ids = prompts
            for _ in range(completion):
                logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
                del out
                probs = torch.nn.functional.softmax(processors(ids, logits), dim=-1)
                tokens = torch.multinomial(probs, num_samples=1)
                del logits, probs
                ids = torch.cat([ids, tokens], dim=-1)
                out = self.policy(input_ids=tokens, cache=cache, use_cache=True, logits_to_keep=1)
            del out, cache
            scored = {}
            for name, used, model, no_adapter in (
                    ("old", old_log_probs, self.policy, False),
                    ("ref", objective.reference_model, self.reference or self.policy, self.reference is None)):
                if used:
                    scored[name] = torch.cat([log_probs(model, chunk, no_adapter).log_probs[:, prompt:]
                                              for chunk in ids.split(batch)])
            return ids, scored

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.policy = trained or policy

        def forward(self, ids, advantages, scored):
            out = log_probs(self.policy, ids)
            logps, entropy = out.log_probs[:, prompt:], out.entropy[:, prompt:]
            old = scored.get("old", logps.detach())
            ratio = torch.exp(logps - old)
            clipped = torch.clamp(ratio, 0.8, 1.2)
            per_token = -torch.min(ratio * advantages, clipped * advantages)
            if "ref" in scored:
                kl = torch.exp(scored["ref"] - logps) - (scored["ref"] - logps) - 1
                per_token = per_token + objective.beta * kl * ratio
            mask = torch.ones_like(per_token)
            return (per_token * mask).sum() / mask.sum() + 0 * entropy.sum()

    prompts = torch.randint(0, vocab, (round_size, prompt))
    return Generation(), Loss(), prompts


def simulate_grpo(recipe) -> SimulationResult:
    """Trace one grpo round of ``recipe``'s model on one process with fake tensors: the generation phase (prefill,
    decoding, scoring) and the training step on one micro-batch, each with its own peak (``phases_gib``)."""
    if reason := why_not_simulable(recipe):
        return SimulationResult(error=reason)
    started = time.perf_counter()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    mem = recipe.memory
    autocast_dtype = _autocast_dtype(recipe)
    model, reference, vocab = _built(recipe)
    disable_dropout_in_model(model)
    add_fused_lm_head(model.get_base_model() if recipe.method.kind != "full" else model,
                      temperature=recipe.objective.grpo.temperature, outputs=("log_probs", "entropy"))
    if reference is not None:
        add_fused_lm_head(reference, temperature=recipe.objective.grpo.temperature)
    phases = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        model, reference = _materialised(model, reference)
        if mem.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        trainable, optimizer = _optimizer_with_states(model)
        generation, loss_step, prompts = grpo_round(model, reference, recipe, vocab)
        tracker = frozen_aware_tracker()
        tracker.track_external(generation, optimizer)
        with tracker:
            model.eval()
            with torch.no_grad():  # TRL generates and scores outside autocast and without gradients
                ids, scored = generation(prompts)
            phases[GENERATION], _ = _snapshot_gib(tracker)
        batch = recipe.training.micro_batch_size
        model.train()
        tracker = frozen_aware_tracker()
        tracker.track_external(loss_step, optimizer, *([reference] if reference is not None else []))  # resident
        with tracker:  # the round's buffers stay alive through its steps; the step takes one micro-batch of them
            buffered = ids.clone(), {name: values.clone() for name, values in scored.items()}
            ids, scored = buffered[0][:batch], {name: values[:batch] for name, values in buffered[1].items()}
            advantages = torch.randn(batch, 1)
            with torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = loss_step(ids, advantages, scored)
            loss.backward()
            del loss
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        phases[TRAINING_STEP], by_category = _snapshot_gib(tracker)
    return SimulationResult(peak_gib=max(phases.values()), peak_by_category=by_category, phases_gib=phases,
                            seconds=time.perf_counter() - started,
                            notes=["simulated on CPU kernels; generation traced as generate's decoding loop"])


def simulate(recipe, evaluation: bool = False) -> SimulationResult:
    """Trace one steady-state training step of ``recipe``'s model on one process, with fake tensors; with
    ``evaluation``, one batch of the Trainer's evaluation loop instead (``prediction_step``: eval mode, no gradients,
    the loss of a micro-batch) between two steps, beside the weights and the optimizer states.

    The model is the one the training entrypoint builds: with ``memory.chunked_loss`` an sft step takes the chunked
    loss (:func:`tuner.loading.chunked_loss.enable_chunked_loss`); dpo and kto take TRL's fused head, as they train.
    With ``data.packing`` the micro-batch is one row of ``micro_batch_size x max_seq_length`` tokens whose
    position ids restart every ``max_seq_length`` tokens, as DataCollatorWithFlattening makes it.
    """
    if reason := why_not_simulable(recipe):
        return SimulationResult(error=reason)
    started = time.perf_counter()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mem = recipe.memory
    autocast_dtype = _autocast_dtype(recipe)
    notes = ["simulated on CPU kernels (sdpa: the CPU flash kernel; AdamW: the single-tensor loop)."]
    if recipe.uses_gpu:
        notes.append("the analytic plan of a GPU recipe also counts CUDA's foreach AdamW temporaries, "
                     "CUDA context and allocator slack, which a CPU trace does not see.")
    batch, seq = recipe.training.micro_batch_size, recipe.training.max_seq_length
    objective = recipe.objective
    model, reference, vocab = _built(recipe)
    model.config.use_cache = False  # as the training entrypoint sets it
    if mem.chunked_loss and not objective.preference:
        enable_chunked_loss(model)
    if objective.preference:
        prepare_like_trl(model, reference, objective.kind)
    if objective.kind == "distill":  # GKDConfig(disable_dropout=True), as tuner.train.distill sets it
        from trl.trainer.utils import disable_dropout_in_model

        disable_dropout_in_model(model)
    tower = image_tower(recipe)
    with FakeTensorMode(allow_non_fake_inputs=True), tower_traceable(tower, batch):
        model, reference = _materialised(model, reference)
        if mem.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        trainable, optimizer = _optimizer_with_states(model)
        trl_step = (reward_step(model) if objective.kind == "reward" else
                    preference_step(model, reference, recipe) if objective.preference else
                    distill_step(model, reference, recipe) if objective.kind == "distill" else None)
        if tower is not None:  # image rows: one image each, its tokens inside the sequence
            inputs = image_batch(model, tower, batch, seq)
        elif recipe.data.packing:
            ids = torch.randint(0, vocab, (1, batch * seq))
            inputs = {"input_ids": ids, "labels": ids, "position_ids": torch.arange(seq).repeat(batch)[None]}
        else:  # dpo and reward stack the chosen and rejected sequences of each pair
            ids = torch.randint(0, vocab, (batch * (2 if objective.kind in ("dpo", "reward") else 1), seq))
            inputs = {"input_ids": ids, "labels": ids}

        def step() -> None:
            with torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = trl_step(ids) if trl_step is not None else model(**inputs).loss
            loss.backward()
            del loss
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        tracker = frozen_aware_tracker()
        tracker.track_external(model if objective.kind == "reward" or trl_step is None else trl_step, optimizer)
        if evaluation:
            model.eval()
        with tracker, _grouped_mm_traceable():
            if evaluation:
                with torch.no_grad(), torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    loss = trl_step(ids) if trl_step is not None else model(**inputs).loss
                del loss
            else:
                step()
        peak, by_category = _snapshot_gib(tracker)
    return SimulationResult(peak_gib=peak, peak_by_category=by_category, seconds=time.perf_counter() - started,
                            notes=notes)
