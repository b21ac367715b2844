"""Tiny image-text configs: each class's own defaults with every size shrunk, so a model builds in well under a
second (on the meta device, or for real on the CPU).  Sizes are passed to the config classes as arguments, so what
a class derives from them (layer_types, no_rope_layers, deepstack indices) is derived again."""
from __future__ import annotations

TEXT = {"hidden_size": 64, "intermediate_size": 128, "intermediate_size_mlp": 128, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 2, "num_experts": 2, "vocab_size": 512,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16}
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "depth": 2, "num_attention_heads": 2,
          "num_heads": 2, "out_hidden_size": 64, "embed_dim": 32, "head_dim": 16, "vision_output_dim": 64,
          "projector_input_dim": 64, "projector_output_dim": 64, "deepstack_visual_indexes": [1],
          "fullatt_block_indexes": [1], "num_position_embeddings": 64}
# model_type -> its ForConditionalGeneration class name, for config.json's architectures
CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
           "qwen3_vl": "Qwen3VLForConditionalGeneration", "gemma3": "Gemma3ForConditionalGeneration",
           "llama4": "Llama4ForConditionalGeneration", "idefics3": "Idefics3ForConditionalGeneration",
           "smolvlm": "SmolVLMForConditionalGeneration", "mistral3": "Mistral3ForConditionalGeneration",
           "llava": "LlavaForConditionalGeneration", "qwen3_5": "Qwen3_5ForConditionalGeneration"}


def _shrunk(sub_config, sizes: dict) -> dict:
    defaults = sub_config.to_dict()
    return {key: value for key, value in sizes.items() if key in defaults}


def tiny_config(model_type: str) -> dict:
    """The config.json of a tiny ``model_type`` image-text model, as save_pretrained writes it."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    default = cls()
    text = _shrunk(default.text_config, TEXT)
    if model_type.endswith("_vl"):  # Qwen-VL's multimodal rotary sections (default 16/24/24): a half of head_dim 16
        text["rope_parameters"] = {**default.text_config.to_dict()["rope_parameters"], "mrope_section": [2, 3, 3]}
    config = cls(text_config=text, vision_config=_shrunk(default.vision_config, VISION))
    config.architectures = [CLASSES[model_type]]
    return config.to_dict()
