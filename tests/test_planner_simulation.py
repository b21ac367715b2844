"""The analytic plan against a fake-tensor trace of the real training step (FakeTensorMode + MemTracker).

Each architecture runs an L8 orthogonal array over the five two-level factors (method, gradient
checkpointing, attention kernel, sequence length, micro-batch): every pair of levels of every two
factors is covered, in 8 of the 32 cells.  TUNER_FULL_SIM_MATRIX=1 runs all 32 cells per architecture.
"""
from __future__ import annotations

import itertools
import json
import os

import pytest

from tuner.planner import plan
from tuner.planner.items import TRAINING_STEP
from tuner.loading.simulate import simulate, why_not_simulable
from tuner.recipe.io import validate_recipe

pytestmark = pytest.mark.slow  # each test traces a training step on the meta device

TOLERANCE = 0.15

ARCHITECTURES = {  # three shapes: GQA Llama, tied-embedding Qwen2 with biases, fused-projection Phi-3 (MHA)
    "llama": dict(model_type="llama", hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
    "qwen2": dict(model_type="qwen2", hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, vocab_size=640, tie_word_embeddings=True),
    "phi3": dict(model_type="phi3", hidden_size=128, intermediate_size=320, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=384, pad_token_id=0, eos_token_id=1),
}
LEVELS = {"method": ("full", "lora"), "checkpointing": (False, True), "attention": ("sdpa", "eager"),
          "seq": (64, 192), "batch": (1, 3)}
# L8 orthogonal array (columns A, B, AB, C, AC of the standard 2^7 design)
L8 = [(0, 0, 0, 0, 0), (0, 0, 0, 1, 1), (0, 1, 1, 0, 0), (0, 1, 1, 1, 1),
      (1, 0, 1, 0, 1), (1, 0, 1, 1, 0), (1, 1, 0, 0, 1), (1, 1, 0, 1, 0)]


def _cells():
    full = os.environ.get("TUNER_FULL_SIM_MATRIX") == "1"
    for shift, arch in enumerate(ARCHITECTURES):
        rows = itertools.product((0, 1), repeat=5) if full else \
            [tuple(level ^ ((shift >> i) & 1) for i, level in enumerate(row)) for row in L8]
        for row in rows:
            yield pytest.param(arch, *(values[level] for values, level in zip(LEVELS.values(), row)),
                               id=f"{arch}-" + "-".join(str(values[level]) for values, level in zip(LEVELS.values(), row)))


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim-models")
    for arch, config in ARCHITECTURES.items():
        (root / arch).mkdir()
        (root / arch / "config.json").write_text(json.dumps(config))
    return root


def _recipe(path, method, checkpointing, attention, seq, batch):
    return validate_recipe({"model": {"id": str(path), "dtype": "float32"}, "method": {"kind": method},
                            "memory": {"mixed_precision": "no", "attention": attention,
                                       "gradient_checkpointing": checkpointing, "max_seq_length": seq,
                                       "micro_batch_size": batch}})


@pytest.mark.parametrize("arch, method, checkpointing, attention, seq, batch", list(_cells()))
def test_analytic_plan_within_15_percent_of_simulation(model_dirs, arch, method, checkpointing, attention, seq, batch):
    recipe = _recipe(model_dirs / arch, method, checkpointing, attention, seq, batch)
    predicted = plan(recipe).devices[0].phase_gib(TRAINING_STEP, ("allocated",))  # the trace sees tensors only
    simulated = simulate(recipe)
    assert simulated.error is None
    assert predicted == pytest.approx(simulated.peak_gib, rel=TOLERANCE), simulated.peak_by_category


# Settings beyond the L8 factors: packing (one row per micro-batch, its block-diagonal mask), the chunked loss (traced
# through the training entrypoint's own patch), 16-bit weights without autocast and fp32 weights under bf16 autocast
# (PEFT's fp32 LoRA branch beside 16-bit activations).  (arch, method, checkpointing, attention, seq, batch, recipe)
TACTIC_CELLS = [
    ("llama", "lora", False, "eager", 64, 3, {"data": {"packing": True}}),
    ("qwen2", "full", False, "sdpa", 64, 3, {"data": {"packing": True}}),
    ("phi3", "lora", True, "sdpa", 192, 3, {"memory": {"chunked_loss": True}}),
    ("qwen2", "full", False, "eager", 192, 1, {"memory": {"chunked_loss": True}}),
    ("llama", "lora", True, "sdpa", 192, 3, {"model": {"dtype": "bfloat16"}}),
    ("phi3", "lora", False, "eager", 64, 3, {"model": {"dtype": "bfloat16"}}),
    ("qwen2", "lora", True, "sdpa", 192, 1, {"memory": {"mixed_precision": "bf16"}}),
]


@pytest.mark.parametrize("arch, method, checkpointing, attention, seq, batch, settings", TACTIC_CELLS,
                         ids=["-".join(map(str, cell[:6])) + "-" + ".".join(k for v in cell[6].values() for k in v)
                              for cell in TACTIC_CELLS])
def test_tactics_agree_with_simulation(model_dirs, arch, method, checkpointing, attention, seq, batch, settings):
    data = _recipe(model_dirs / arch, method, checkpointing, attention, seq, batch).model_dump(mode="json")
    for section, values in settings.items():
        data[section].update(values)
    recipe = validate_recipe(data)
    predicted = plan(recipe).devices[0].phase_gib(TRAINING_STEP, ("allocated",))
    simulated = simulate(recipe)
    assert simulated.error is None
    assert predicted == pytest.approx(simulated.peak_gib, rel=0.05), simulated.peak_by_category


def test_unsimulable_cases_say_why():
    qlora = validate_recipe({"model": {"id": "HuggingFaceTB/SmolLM2-135M"},
                             "method": {"kind": "qlora", "quantization": {"bits": 4}}})
    assert "bitsandbytes" in why_not_simulable(qlora)
    assert "bitsandbytes" in simulate(qlora).error
    sharded = validate_recipe({"model": {"id": "HuggingFaceTB/SmolLM2-135M"},
                               "hardware": {"gpus_per_machine": 4, "gpu": "A100-80GB"},
                               "memory": {"distributed": "deepspeed", "zero_stage": 3}})
    assert "sharding" in simulate(sharded).error


# dpo/kto: TRL's step on a wider vocabulary than the SFT cells', so the reference copy, the doubled batch and the
# fused head's tiles (4096 tokens x 32768, and its fp32 fold on the CPU) all weigh in the peak
PREFERENCE_ARCHITECTURE = dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=2, vocab_size=4096)


def _preference_cells():
    for row in L8:
        values = [values[level] for values, level in zip(LEVELS.values(), row)]
        yield pytest.param("dpo", *values, False, id="dpo-" + "-".join(map(str, values)))
    yield pytest.param("dpo", "full", False, "sdpa", 192, 3, True, id="dpo-precomputed-reference")
    yield pytest.param("kto", "full", False, "sdpa", 192, 3, False, id="kto-full")
    yield pytest.param("kto", "lora", True, "sdpa", 192, 3, False, id="kto-lora")


@pytest.mark.parametrize("objective, method, checkpointing, attention, seq, batch, precompute", list(_preference_cells()))
def test_preference_plan_within_15_percent_of_a_traced_trl_step(tmp_path, objective, method, checkpointing, attention,
                                                                 seq, batch, precompute):
    (tmp_path / "config.json").write_text(json.dumps(PREFERENCE_ARCHITECTURE))
    recipe = validate_recipe({"model": {"id": str(tmp_path), "dtype": "float32"}, "method": {"kind": method},
                              "objective": {"kind": objective, "precompute_ref_log_probs": precompute},
                              "memory": {"mixed_precision": "no", "attention": attention, "max_seq_length": seq,
                                         "gradient_checkpointing": checkpointing, "micro_batch_size": batch}})
    device = plan(recipe).devices[0]
    simulated = simulate(recipe)
    assert simulated.error is None
    assert device.total_gib - device.terms["overhead"] == pytest.approx(simulated.peak_gib, rel=TOLERANCE), \
        (device.terms, simulated.peak_by_category)
    assert (device.terms["reference_model"] > 0) == (method == "full" and not precompute)


# What a recipe sets beyond the factors above, each against the trace of the model that trains (simulate wraps it with
# the recipe's own LoraConfig): Gemma-2's soft-capped eager attention and logits, modules_to_save (a trained copy with
# its gradient and AdamW moments), LoRA on the output head, and the Trainer's evaluation batch.  The Gemma-2 shape and
# the heads of these cells differ from the ones the terms were found on (benchmarks/recipe_settings_traces.py).
GEMMA2 = dict(model_type="gemma2", hidden_size=192, intermediate_size=512, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=3, head_dim=32, vocab_size=1024)
SETTING_CELLS = [  # (config, method, checkpointing, seq, batch, settings, evaluation)
    (GEMMA2, "lora", False, 192, 3, {}, False),
    (GEMMA2, "full", True, 64, 3, {"model": {"dtype": "bfloat16"}, "memory": {"mixed_precision": "bf16"}}, False),
    # the MLP's backward holds two intermediate-wide gradients beyond what it saved, not four (+8.1% before)
    (GEMMA2, "full", True, 192, 3, {}, False),
    (ARCHITECTURES["qwen2"], "lora", False, 192, 3, {"method": {"lora": {"modules_to_save": ["lm_head"]}}}, False),
    (GEMMA2, "lora", True, 192, 1, {"method": {"lora": {"modules_to_save": ["embed_tokens"]}}}, False),
    (ARCHITECTURES["phi3"], "lora", False, 192, 3, {}, True),
    (GEMMA2, "full", False, 192, 3, {}, True),
    # PEFT's fp32 copy of a bf16 input, autocast's adapter copies, the masks (-13.7% before, docs/memory.md)
    (ARCHITECTURES["phi3"], "lora", False, 192, 3,
     {"model": {"dtype": "bfloat16"}, "memory": {"mixed_precision": "bf16"}}, True),
    (GEMMA2, "lora", False, 192, 3, {}, True),  # eager's probabilities kept through the MLP (-9.4% before)
]


@pytest.mark.parametrize("config, method, checkpointing, seq, batch, settings, evaluation", SETTING_CELLS,
                         ids=[f"{c[0]['model_type']}-{c[1]}-{c[2]}-{c[3]}-{c[4]}-" + (
                             ".".join(["evaluation"] * c[6] + [k for v in c[5].values() for k in v]) or "step")
                              for c in SETTING_CELLS])
def test_recipe_settings_agree_with_simulation(tmp_path, config, method, checkpointing, seq, batch, settings,
                                               evaluation):
    from tuner.planner.items import EVAL

    (tmp_path / "config.json").write_text(json.dumps(config))
    data = _recipe(tmp_path, method, checkpointing, "auto", seq, batch).model_dump(mode="json")
    for section, values in settings.items():
        for key, value in values.items():
            if isinstance(value, dict):
                data[section][key].update(value)
            else:
                data[section][key] = value
    recipe = validate_recipe(data)
    device = plan(recipe).devices[0]
    predicted = device.moment_gib(EVAL, ("allocated",)) if evaluation else device.phase_gib(TRAINING_STEP,
                                                                                             ("allocated",))
    simulated = simulate(recipe, evaluation=evaluation)
    assert simulated.error is None
    assert predicted == pytest.approx(simulated.peak_gib, rel=0.08), simulated.peak_by_category


def test_a_module_to_save_the_planner_cannot_size_is_a_note_not_silence(model_dirs):
    recipe = _recipe(model_dirs / "llama", "lora", False, "sdpa", 64, 1)
    recipe.method.lora.modules_to_save = ["score"]
    assert any("'score' is not sized" in note for note in plan(recipe).notes)
    recipe.method.lora.modules_to_save = ["lm_head"]
    saved = plan(recipe)
    assert saved.trainable_params - plan(_recipe(model_dirs / "llama", "lora", False, "sdpa", 64, 1)).trainable_params \
        == 512 * 128, "the trained copy of the head counts as trainable"


# reward: TRL's RewardTrainer step (the score head in place of the output head, chosen and rejected stacked, the
# margin loss) on three shapes: the preference cells' wide-vocabulary Llama, the fused-projection Phi-3, and the
# image-text demo (llava, which transformers has no sequence-classification class for: tuner's generic head)
REWARD_CELLS = [  # (config or model id, method, checkpointing, attention, seq, batch)
    (PREFERENCE_ARCHITECTURE, "full", False, "sdpa", 192, 3),
    (PREFERENCE_ARCHITECTURE, "lora", True, "eager", 64, 3),
    (ARCHITECTURES["phi3"], "full", True, "eager", 64, 1),
    (ARCHITECTURES["phi3"], "lora", False, "sdpa", 192, 1),
    ("builtin:demo-vlm", "full", False, "sdpa", 192, 3),
    ("builtin:demo-vlm", "lora", False, "sdpa", 192, 1),
]


@pytest.mark.parametrize("config, method, checkpointing, attention, seq, batch", REWARD_CELLS,
                         ids=["-".join(map(str, (c[0] if isinstance(c[0], str) else c[0]["model_type"], *c[1:])))
                              for c in REWARD_CELLS])
def test_reward_plan_within_8_percent_of_a_traced_reward_step(tmp_path, config, method, checkpointing, attention,
                                                              seq, batch):
    from tuner.catalog.models import model_facts

    if isinstance(config, str):
        model_id = config
    else:
        (tmp_path / "config.json").write_text(json.dumps(config))
        model_id = str(tmp_path)
    recipe = validate_recipe({"model": {"id": model_id, "dtype": "float32"}, "method": {"kind": method},
                              "objective": {"kind": "reward"},
                              "memory": {"mixed_precision": "no", "attention": attention,
                                         "gradient_checkpointing": checkpointing},
                              "training": {"max_seq_length": seq, "micro_batch_size": batch}})
    device = plan(recipe).devices[0]
    simulated = simulate(recipe)
    assert simulated.error is None
    assert device.total_gib - device.terms["overhead"] == pytest.approx(simulated.peak_gib, rel=0.08), \
        (device.terms, simulated.peak_by_category)
    # one score per position, no vocabulary logits: the loss is a sliver of the paired batch's hidden states
    assert device.terms["logits_loss"] * 2**30 < 2 * batch * seq * model_facts(model_id).hidden_size * 4
