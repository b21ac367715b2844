"""Tiny image-text models saved as a user's checkpoint would be: the class's own weights (random, seeded), tuner's
character tokenizer with the class's own image tokens, and the class's own processor over it, with a chat template
that puts the image placeholder where the user's image part is.  Sizes from :func:`image_text_configs.tiny_config`,
images small (the built-in shapes are 32x32) so that a row is a few dozen tokens."""
from __future__ import annotations

from pathlib import Path

from image_text_configs import tiny_config

# model_type -> its tokenizer's image tokens (attribute: token) and the text of one image in a chat template
IMAGE_TOKENS = {
    "qwen2_5_vl": ({"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                    "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"},
                   "<|vision_start|><|image_pad|><|vision_end|>"),
    "gemma3": ({"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"},
               "<start_of_image>"),
}


def save_tiny_image_text_model(folder: Path, model_type: str) -> Path:
    """Save a tiny ``model_type`` model with its processor in ``folder``; returns the folder."""
    import torch
    import transformers

    from tuner.loading.demo_model import image_chat_template, train_tokenizer

    tokens, placeholder = IMAGE_TOKENS[model_type]
    tokenizer = train_tokenizer(tokens, image_chat_template(placeholder))
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in tokens.items()}
    config = tiny_config(model_type)
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id)
    config["text_config"].update(vocab_size=len(tokenizer), **special)
    config.update({key: value for key, value in special.items() if key in config})  # Qwen-VL's copies of them
    save_processor = _PROCESSORS[model_type](config, tokenizer, ids)
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.for_model(**config))
    model.save_pretrained(folder)
    save_processor(folder)
    return folder


def _qwen2_5_vl(config: dict, tokenizer, ids: dict):
    """The tower in 8x8 patches merged 2x2: a 32x32 picture (the image processor's pixel bounds) is 16 patches, 4
    image tokens.  Saved as a hub checkpoint holds it (the tokenizer, the image processor naming
    Qwen2_5_VLProcessor, the chat template): transformers 5.24 builds that processor only with its video
    processor, which needs torchvision."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    config["vision_config"].update(patch_size=8, window_size=16)
    config.update(image_token_id=ids["image_token"], video_token_id=ids["video_token"],
                  vision_start_token_id=ids["vision_start_token"], vision_end_token_id=ids["vision_end_token"])
    images = Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, size={"shortest_edge": 32 * 32,
                                                                         "longest_edge": 32 * 32})

    def save(folder: Path) -> None:
        tokenizer.save_pretrained(folder)
        images.processor_class = "Qwen2_5_VLProcessor"
        images.save_pretrained(folder)
    return save


def _gemma3(config: dict, tokenizer, ids: dict):
    """SigLIP seeing 32x32 in 8x8 patches (16), pooled 2x2 to 4 image tokens; Gemma 3's Pillow image processor."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    config["vision_config"].update(image_size=32, patch_size=8)
    config.update(mm_tokens_per_image=4, boi_token_index=ids["boi_token"], eoi_token_index=ids["eoi_token"],
                  image_token_index=ids["image_token"])
    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    processor = Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=4,
                                chat_template=tokenizer.chat_template)
    return processor.save_pretrained


_PROCESSORS = {"gemma3": _gemma3, "qwen2_5_vl": _qwen2_5_vl}
