"""The plan of a grpo run: the generation phase (KV cache, sampler, scoring), the reference only with a KL penalty
and full weights, vLLM's share, reward models, the advisor's rollout rungs, and the whole round held to a fake-tensor
trace of one GRPO step (generation and training step, each within 8% on the allocated terms)."""
from __future__ import annotations

import json

import pytest

from tuner.planner import advise, plan
from tuner.planner.items import DECODING, GENERATION, GIB, PREFILL, SCORING, TRAINING_STEP
from tuner.recipe.io import validate_recipe
from tuner.recipe.tactics import Rung

pytestmark = pytest.mark.slow  # each test traces a GRPO round on the meta device

REWARDS = [{"kind": "exact_match", "column": "answer"}]


def grpo_recipe(model="builtin:demo", method="full", beta=0.0, grpo=None, memory=None, hardware=None, **sections):
    return validate_recipe({
        "model": {"id": model, "dtype": "float32"},
        "objective": {"kind": "grpo", "beta": beta,
                      "grpo": {"num_generations": 4, "max_prompt_length": 32, "max_completion_length": 32,
                               "rewards": REWARDS, **(grpo or {})}},
        "method": {"kind": method},
        "hardware": hardware or {"gpus_per_machine": 0},
        "memory": {"mixed_precision": "no", "attention": "sdpa", "micro_batch_size": 4, "max_seq_length": 64,
                   **(memory or {})},
        "data": {"source": "builtin:reverse-prompts", "format": "prompt", "eval_fraction": 0},
        **sections})


def items(device, category=None, source=None):
    return [i for i in device.items if (category is None or i.category == category)
            and (source is None or i.source == source)]


def test_generation_is_a_phase_with_the_kv_cache_of_every_completion(demo_model_path):
    recipe = grpo_recipe(grpo={"steps_per_generation": 2})
    device = plan(recipe).devices[0]
    assert GENERATION in device.phases and {PREFILL, DECODING, SCORING} <= set(device.moments)
    cache = next(i for i in device.items if i.source == "grpo-kv-cache" and i.name.startswith("KV cache ("))
    # 2 (K, V) x 4 layers x (4 x 2 = 8 completions) x 64 tokens x 2 KV heads x 32 dims x 4 bytes
    assert cache.bytes == 2 * 4 * 8 * 64 * 2 * 32 * 4 and cache.phase == DECODING
    assert device.phase_gib(GENERATION) >= device.moment_gib(DECODING) > 0
    assert plan(grpo_recipe(grpo={"steps_per_generation": 1})).devices[0].phase_gib(GENERATION, ("allocated",)) < \
        device.phase_gib(GENERATION, ("allocated",))  # smaller rounds: fewer completions at once


def test_reference_weights_only_with_a_kl_penalty_and_full_weights(demo_model_path):
    def reference(**kwargs):
        return sum(i.bytes for i in items(plan(grpo_recipe(**kwargs)).devices[0], "reference_model"))

    assert reference(beta=0.0) == 0
    assert reference(beta=0.04) == plan(grpo_recipe(beta=0.04)).params["total"] * 4
    assert reference(beta=0.04, method="lora") == 0  # the adapter disabled is the reference
    scoring = items(plan(grpo_recipe(beta=0.04)).devices[0], source="grpo-scoring")
    assert scoring and "reference" in scoring[0].name and not items(plan(grpo_recipe()).devices[0],
                                                                      source="grpo-scoring")


GPU = {"gpus_per_machine": 1, "gpu": "H100-80GB"}


def test_vllm_colocate_takes_its_share_of_the_gpu_and_sleeps_through_the_step():
    model = "Qwen/Qwen2.5-0.5B"
    awake = plan(grpo_recipe(model=model, hardware=GPU, grpo={"generation": "vllm_colocate",
                                                              "vllm_gpu_memory_utilization": 0.3})).devices[0]
    share = next(i for i in awake.items if i.source == "vllm-colocate")
    assert share.bytes == pytest.approx(0.3 * awake.capacity_gib * GIB) and share.level == "device"
    assert not items(awake, source="grpo-kv-cache")  # vLLM holds the KV cache in its share
    asleep = plan(grpo_recipe(model=model, hardware=GPU, grpo={"generation": "vllm_colocate",
                                                               "vllm_sleep_mode": True})).devices[0]
    assert asleep.phase_gib(TRAINING_STEP) < awake.phase_gib(TRAINING_STEP) - 0.29 * awake.capacity_gib


def test_vllm_server_gpus_are_a_device_of_their_own():
    memory_plan = plan(grpo_recipe(model="meta-llama/Llama-3.1-8B", hardware=GPU, memory={"max_seq_length": 64},
                                   grpo={"generation": "vllm_server", "vllm_server_gpus": 2,
                                         "vllm_gpu_memory_utilization": 0.9}))
    server = next(d for d in memory_plan.devices if d.kind == "vllm")
    assert server.count == 2 and server.capacity_gib == pytest.approx(0.9 * memory_plan.devices[0].capacity_gib)
    assert items(server, "weights")[0].bytes == pytest.approx(8_030_261_248 * 2 / 2)
    assert not items(memory_plan.devices[0], source="grpo-kv-cache")


def test_a_reward_model_is_planned_with_its_forward(tmp_path, demo_model_path):
    reward = tmp_path / "reward"
    reward.mkdir()
    (reward / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForSequenceClassification"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "vocab_size": 100, "tie_word_embeddings": False}))
    device = plan(grpo_recipe(grpo={"rewards": REWARDS + [{"kind": "model", "model": str(reward)}]})).devices[0]
    weights = items(device, "reward_model")[0]
    # backbone (embeddings, 2 layers, final norm) and a one-output score head instead of the 100-wide LM head
    backbone = 100 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    assert weights.bytes == (backbone + 64) * 4
    assert "reward model forward" in next(i for i in device.items if i.source == "grpo-scoring").name


def test_the_advisor_climbs_the_rollout_rungs_cheapest_first():
    recipe = grpo_recipe(model="meta-llama/Llama-3.1-8B", method="lora", beta=0.04, hardware=GPU,
                         grpo={"max_prompt_length": 1024, "max_completion_length": 7168, "steps_per_generation": 8,
                               "num_generations": 8},
                         memory={"micro_batch_size": 8, "gradient_accumulation_steps": 8, "max_seq_length": 8192,
                                 "gradient_checkpointing": True})
    assert not plan(recipe).fits  # 64 completions of 8k tokens generated at once
    best = advise(recipe)[0]
    assert best.fits and best.changes and set(best.changes) <= {Rung.SMALLER_ROUNDS, Rung.MICRO_BATCH}
    assert any(line.startswith("objective.grpo.steps_per_generation=") for line in best.overrides)
    assert Rung.NO_REFERENCE not in {rung for advice in advise(recipe, limit=20) for rung in advice.changes}


def test_no_reference_needs_the_recipes_permission(demo_model_path):
    from tuner.recipe.tactics import apply_tactics, climb

    strict = grpo_recipe(beta=0.04)
    assert climb(strict, Rung.NO_REFERENCE) is None
    allowed = grpo_recipe(beta=0.04, method="full").model_copy(deep=True)
    allowed = validate_recipe({**allowed.model_dump(mode="json"), "method": {"kind": "full", "allow_method_change": True}})
    assert apply_tactics(allowed, climb(allowed, Rung.NO_REFERENCE)).objective.beta == 0.0


# -- against a fake-tensor trace of one GRPO round --------------------------------------------------------------------

SHAPES = {  # GQA Llama, tied MQA Qwen2 with biases, fused-projection MHA Phi-3, and a deep narrow Llama whose KV
    # cache outweighs its model states
    "llama": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "hidden_size": 320, "intermediate_size": 864, "num_hidden_layers": 3,
              "num_attention_heads": 5, "num_key_value_heads": 1, "vocab_size": 3001, "tie_word_embeddings": True},
    "deep": {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 8,
             "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512, "tie_word_embeddings": True},
    "phi3": {"model_type": "phi3", "hidden_size": 192, "intermediate_size": 512, "num_hidden_layers": 3,
             "num_attention_heads": 6, "num_key_value_heads": 6, "vocab_size": 5000, "tie_word_embeddings": False,
             "pad_token_id": 0},
}
# (shape, method, beta, prompt, completion, micro-batch, steps per generation, settings): full and LoRA, beta 0 and
# above, a round over one and two micro-batches (the old policy scored again), sampling knobs and checkpointing
CELLS = [
    ("llama", "full", 0.0, 24, 16, 4, 2, {"grpo": {"temperature": 0.9, "top_p": 0.9}}),
    ("qwen2", "full", 0.04, 32, 16, 4, 1, {}),
    ("phi3", "lora", 0.04, 16, 24, 2, 2, {"memory": {"gradient_accumulation_steps": 2}}),
    ("llama", "lora", 0.0, 16, 16, 4, 1, {"memory": {"gradient_checkpointing": True, "attention": "eager"}}),
    ("deep", "full", 0.0, 48, 48, 8, 2, {"memory": {"gradient_accumulation_steps": 2}}),
]
TRACE_TOLERANCE = 0.08


@pytest.mark.parametrize("cell", CELLS, ids=[f"{c[0]}-{c[1]}-beta{c[2]}" for c in CELLS])
def test_round_within_8_percent_of_a_traced_grpo_step(cell, tmp_path):
    from tuner.loading.simulate import simulate_grpo

    shape, method, beta, prompt, completion, batch, rounds, settings = cell
    (tmp_path / "config.json").write_text(json.dumps({**SHAPES[shape], "max_position_embeddings": 512}))
    memory = {"micro_batch_size": batch, "max_seq_length": prompt + completion, **settings.get("memory", {})}
    recipe = grpo_recipe(model=str(tmp_path), method=method, beta=beta, memory=memory,
                         grpo={"max_prompt_length": prompt, "max_completion_length": completion,
                               "steps_per_generation": rounds, "num_generations": 2, **settings.get("grpo", {})})
    device = plan(recipe).devices[0]
    traced = simulate_grpo(recipe)
    assert traced.error is None
    for phase in (GENERATION, TRAINING_STEP):
        planned = device.phase_gib(phase, ("allocated",))
        print(f"{cell[:7]} {phase}: planned {planned * 1024:.2f} MiB, traced {traced.phases_gib[phase] * 1024:.2f} "
              f"MiB, ratio {planned / traced.phases_gib[phase]:.3f}")
        assert planned == pytest.approx(traced.phases_gib[phase], rel=TRACE_TOLERANCE), phase
