"""Facts of the built-in models (``builtin:demo``, ``builtin:demo-moe``): their architecture and where each is cached
once built.

Nothing can be downloaded here, so tuner builds its own (``tuner.loading.demo_model``, one builder for every entry
of :data:`BUILTIN_MODELS`); the planner, the renderers and the wizard read their shape from these numbers without
building them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tuner.home import tuner_home

BUILTIN_PREFIX = "builtin:"
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
# one token per printable ASCII character plus newline, and the special tokens (every built-in model's tokenizer)
DEMO_VOCAB_SIZE = 95 + 1 + len(SPECIAL_TOKENS)
IMAGE_TOKEN = "<image>"  # an image-text built-in's placeholder, one per image token (LLaVA's processor expands it)
IMAGE_TOKEN_ID = len(SPECIAL_TOKENS)  # the trainer numbers the special tokens first, then the placeholder


@dataclass(frozen=True)
class BuiltinModel:
    """One model tuner builds itself: a transformers class, its config, the character tokenizer."""

    id: str
    model_type: str  # transformers' config type (AutoConfig.for_model)
    architecture: str  # the causal-LM class AutoModelForCausalLM builds from it
    config: dict = field(default_factory=dict)  # beyond the vocabulary and the special tokens' ids
    about: str = ""
    image: dict | None = None  # an image-text model: its image processor's settings (the tokenizer adds IMAGE_TOKEN)

    @property
    def vocab_size(self) -> int:
        return DEMO_VOCAB_SIZE + (1 if self.image else 0)

    def full_config(self) -> dict:
        """The config.json mapping the builder makes it from (its saved config.json adds only what save_pretrained
        writes), so its shipped inventory serves before and after it is built; an image-text model's vocabulary and
        image token id are its language model's (``text_config``)."""
        if not self.image:
            return {"model_type": self.model_type, "vocab_size": DEMO_VOCAB_SIZE, **self.config}
        text = {**self.config["text_config"], "vocab_size": self.vocab_size}
        return {"model_type": self.model_type, **self.config, "text_config": text, "image_token_id": IMAGE_TOKEN_ID}


DEMO_MODEL_ID = "builtin:demo"
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
DEMO_MOE_MODEL_ID = "builtin:demo-moe"
# A Qwen3-MoE-shaped decoder of ~1.39M parameters: the demo's attention, and in every layer a router over 8 fused
# experts of which each token uses 2 (transformers' grouped-mm experts, what PEFT's target_parameters adapts).
DEMO_MOE_CONFIG = dict(
    hidden_size=128,
    intermediate_size=344,  # unused: no layer is dense (decoder_sparse_step 1, no mlp_only_layers)
    moe_intermediate_size=96,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
DEMO_SMALL_MODEL_ID = "builtin:demo-small"
# The demo's shape at half its depth (~0.4M parameters): demo-distill's student, which learns word reversal from
# the trained demo's distributions (a quarter of its width as well learnt no reversal in 119 steps).
DEMO_SMALL_CONFIG = dict(DEMO_CONFIG, num_hidden_layers=2)
DEMO_VLM_MODEL_ID = "builtin:demo-vlm"
# A LLaVA of ~1M parameters: a CLIP vision tower seeing 32x32 images in 8x8 patches (16 image tokens), a two-layer
# projector, and the demo's Llama as its language model -- large enough to name a drawn shape and its colour.
DEMO_VLM_IMAGE = dict(size=32, patch_size=8)
DEMO_VLM_CONFIG = dict(
    vision_config=dict(model_type="clip_vision_model", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, image_size=DEMO_VLM_IMAGE["size"],
                       patch_size=DEMO_VLM_IMAGE["patch_size"], projection_dim=64),
    text_config=dict(model_type="llama", **DEMO_CONFIG),
    vision_feature_select_strategy="default",  # the patch tokens, without CLIP's class token
    vision_feature_layer=-1,
    projector_hidden_act="gelu",
    tie_word_embeddings=True,
)
BUILTIN_MODELS = {model.id: model for model in (
    BuiltinModel(DEMO_MODEL_ID, "llama", "LlamaForCausalLM", DEMO_CONFIG,
                 "a tiny Llama (0.8M parameters) with a character tokenizer"),
    BuiltinModel(DEMO_MOE_MODEL_ID, "qwen3_moe", "Qwen3MoeForCausalLM", DEMO_MOE_CONFIG,
                 "a tiny Qwen3-MoE (1.4M parameters, 8 experts, top-2) with the same tokenizer"),
    BuiltinModel(DEMO_SMALL_MODEL_ID, "llama", "LlamaForCausalLM", DEMO_SMALL_CONFIG,
                 "the demo's Llama at half its depth (0.4M parameters), the same tokenizer"),
    BuiltinModel(DEMO_VLM_MODEL_ID, "llava", "LlavaForConditionalGeneration", DEMO_VLM_CONFIG,
                 "a tiny LLaVA (0.9M parameters: CLIP tower, projector, the demo's Llama) that sees 32x32 images",
                 image=DEMO_VLM_IMAGE),
)}
DEMO_ARCHITECTURE = BUILTIN_MODELS[DEMO_MODEL_ID].architecture  # what tuner.loading.demo_model builds


def is_builtin(model_id: str) -> bool:
    return model_id.startswith(BUILTIN_PREFIX)


def builtin_model(model_id: str) -> BuiltinModel:
    """The built-in model ``model_id``; refuses any other built-in name (ValueError), naming the ones there are."""
    if model_id not in BUILTIN_MODELS:
        raise ValueError(f"unknown built-in model {model_id!r}; the built-in models are {', '.join(BUILTIN_MODELS)}")
    return BUILTIN_MODELS[model_id]


def demo_model_dir(model_id: str = DEMO_MODEL_ID) -> Path:
    """Where the built-in model is (or will be) saved; refuses any other built-in name."""
    return tuner_home() / "models" / builtin_model(model_id).id.removeprefix(BUILTIN_PREFIX)
