"""Each layer kind the planner models, held to a fake-tensor trace of a tiny instance of a real transformers class:
a mixture of experts (Qwen3-MoE's grouped dispatch, gpt-oss's clamped experts and attention sinks, Llama 4's
every-expert MLP), DeepSeek-V3's multi-head latent attention with shared experts, Qwen3-Next's gated delta net beside
gated attention, and Gemma 3's sliding-window layers; full fine-tuning and LoRA (LoRA on the fused experts, which
all-linear adapts), gradient checkpointing on and off.  The errors are tabled in docs/memory.md, "Layer kinds"."""
from __future__ import annotations

import json

import pytest

from plan_trace import assert_plan_matches_trace
from tuner.recipe.io import validate_recipe

_BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=256, intermediate_size=96)
TINY = {
    "qwen3_moe": dict(model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      decoder_sparse_step=1, mlp_only_layers=[]),
    "deepseek_v3": dict(model_type="deepseek_v3", q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
                        n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1,
                        topk_group=1, num_key_value_heads=4, head_dim=8),
    "qwen3_next": dict(model_type="qwen3_next", layer_types=["linear_attention", "full_attention"],
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1,
                       mlp_only_layers=[]),
    "gpt_oss": dict(model_type="gpt_oss", num_local_experts=8, num_experts_per_tok=2, intermediate_size=32,
                    layer_types=["sliding_attention", "full_attention"], sliding_window=16),
    "llama4_text": dict(model_type="llama4_text", num_local_experts=4, num_experts_per_tok=1, intermediate_size=32,
                        intermediate_size_mlp=96, interleave_moe_layer_step=1, no_rope_layers=[1, 0],
                        attention_chunk_size=32),
    "gemma3_text": dict(model_type="gemma3_text", layer_types=["sliding_attention", "full_attention"],
                        sliding_window=16),
}
# (class, method, gradient checkpointing, attention): each class full and LoRA, checkpointing on in one of them
# (gpt-oss runs eager only: transformers refuses sdpa for it)
CELLS = [
    ("qwen3_moe", "full", False, "sdpa"), ("qwen3_moe", "lora", True, "sdpa"),
    ("deepseek_v3", "full", True, "sdpa"), ("deepseek_v3", "lora", False, "sdpa"),
    ("qwen3_next", "full", False, "sdpa"), ("qwen3_next", "lora", True, "sdpa"),
    ("gpt_oss", "full", True, "eager"), ("gpt_oss", "lora", False, "eager"),
    ("llama4_text", "full", False, "eager"), ("llama4_text", "lora", True, "sdpa"),
    ("gemma3_text", "full", True, "sdpa"), ("gemma3_text", "full", False, "eager"),
    ("gemma3_text", "lora", False, "sdpa"), ("gpt_oss", "lora", True, "eager"),
]  # (the last two: LoRA branches sharing q/k/v's input; checkpointed eager with its masks, the table's worst cell)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("layer-kinds")
    for name, config in TINY.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({**_BASE, **config}))
    return root


@pytest.mark.parametrize("model_type, method, checkpointing, attention", CELLS,
                         ids=["-".join(map(str, cell)) for cell in CELLS])
@pytest.mark.slow
def test_each_layer_kind_plans_its_traced_peak(tiny_dirs, model_type, method, checkpointing, attention):
    lora = {"lora": {"dropout": 0}} if method == "lora" else {}  # PEFT's ParamWrapper on fused experts needs 0
    recipe = validate_recipe({"model": {"id": str(tiny_dirs / model_type), "dtype": "float32"},
                              "method": {"kind": method, **lora},
                              "memory": {"mixed_precision": "no", "attention": attention,
                                         "gradient_checkpointing": checkpointing, "max_seq_length": 128,
                                         "micro_batch_size": 2}})
    assert_plan_matches_trace(recipe)
