"""Facts of the built-in demo model (``builtin:demo``): its architecture and where it is cached once built.

Nothing can be downloaded here, so tuner builds its own default (``tuner.loading.demo_model``); the
planner, the renderers and the wizard read its shape from these numbers without building it.
"""
from __future__ import annotations

from pathlib import Path

from tuner.home import tuner_home

BUILTIN_PREFIX = "builtin:"
DEMO_MODEL_ID = "builtin:demo"
DEMO_ARCHITECTURE = "LlamaForCausalLM"  # what tuner.loading.demo_model builds

# A Llama-shaped decoder of ~0.8M parameters: large enough to learn word reversal,
# small enough to train in well under a minute on two CPU cores.
DEMO_CONFIG = dict(
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_theta=10000.0,
)
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
# one token per printable ASCII character plus newline, and the special tokens
DEMO_VOCAB_SIZE = 95 + 1 + len(SPECIAL_TOKENS)


def is_builtin(model_id: str) -> bool:
    return model_id.startswith(BUILTIN_PREFIX)


def demo_model_dir(model_id: str = DEMO_MODEL_ID) -> Path:
    """Where the built-in model is (or will be) saved; refuses any other built-in name."""
    if model_id != DEMO_MODEL_ID:
        raise ValueError(f"unknown built-in model {model_id!r}; the built-in model is {DEMO_MODEL_ID}")
    return tuner_home() / "models" / model_id.removeprefix(BUILTIN_PREFIX)
