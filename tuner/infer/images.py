"""Answers of an image-text model: the model's own processor renders the conversation through its chat template
and turns each image into its tokens and pixel values, then the model generates (``tuner infer --image``, ``tuner
chat``'s ``/image``, ``tuner serve``'s image_url parts, and the held-out score of image data all come here)."""
from __future__ import annotations

from pathlib import Path

from tuner.data.images import MAX_IMAGE_PIXELS, ImageProblem, open_image
from tuner.infer.generate import execution_device, generation_kwargs


def user_turn(text: str, images: int) -> dict:
    """A user message holding ``images`` image placeholders, then ``text``."""
    return {"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": text}]}


def image_answers(model, processor, conversations: list[tuple[list[dict], list]], max_new_tokens: int,
                  greedy: bool = True, temperature: float = 1.0, top_p: float = 1.0, batch_size: int = 16) -> list[str]:
    """The answer to each (messages, PIL images) pair, in order; the messages' image parts are placeholders the
    images fill in order."""
    import torch

    tokenizer = processor.tokenizer
    settings = generation_kwargs(tokenizer, max_new_tokens, greedy, temperature, top_p)
    answers: list[str] = []
    model.eval()
    for start in range(0, len(conversations), batch_size):
        batch = conversations[start:start + batch_size]
        texts = [processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                 for messages, _ in batch]
        images = [list(pictures) for _, pictures in batch]
        inputs = processor(text=texts, images=images if any(images) else None, return_tensors="pt", padding=True,
                           padding_side="left", add_special_tokens=False).to(execution_device(model))
        with torch.no_grad():
            output = model.generate(**inputs, **settings)
        answers += tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return answers


def image_file(path: str, max_pixels: int = MAX_IMAGE_PIXELS):
    """The picture at ``path`` (a command-line argument) within the bounds; ValueError naming it otherwise."""
    try:
        return open_image(str(Path(path).expanduser()), None, max_pixels)
    except ImageProblem as exc:
        raise ValueError(f"--image: {exc}") from None
