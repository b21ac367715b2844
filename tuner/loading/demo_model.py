"""The built-in models (``builtin:demo``, a tiny Llama; ``builtin:demo-moe``, a tiny Qwen3-MoE): each a
transformers class of :data:`tuner.catalog.demo.BUILTIN_MODELS` with a character tokenizer trained on the fly.

Nothing can be downloaded here, so tuner builds its own once, saves it in
Hugging Face format under ``$TUNER_HOME/models/``, and from then on it is loaded
through the ordinary ``from_pretrained`` path like any user model.  Ranks and machines that share the home build
it once between them (:func:`tuner.build_once.build_once`).
"""
from __future__ import annotations

import hashlib
import json
import string
import subprocess
import sys
from pathlib import Path

from tuner.build_once import build_once, is_built
from tuner.catalog.demo import DEMO_MODEL_ID, IMAGE_TOKEN, SPECIAL_TOKENS, builtin_model, demo_model_dir

# A compact template keeps the demo's sequences short: "reverse\nabc=cba</s>".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ message['content'] + '=' }}{% endif %}"
    "{% endfor %}"
)


def image_chat_template(placeholder: str) -> str:
    """The compact template for an image-text model, whose turns may be lists of parts: an image part is
    ``placeholder`` (the text its processor expands to the image's tokens), a text part its text:
    "<image>name it=red circle</s>"."""
    return (
        "{% for message in messages %}"
        "{% if message['content'] is string %}{% set text = message['content'] %}"
        "{% else %}{% set text = namespace(value='') %}"
        "{% for part in message['content'] %}"
        f"{{% if part['type'] == 'image' %}}{{% set text.value = text.value + '{placeholder}' %}}"
        "{% else %}{% set text.value = text.value + part['text'] %}{% endif %}"
        "{% endfor %}{% set text = text.value %}{% endif %}"
        "{% if message['role'] == 'assistant' %}{{ text + eos_token }}{% else %}{{ text + '=' }}{% endif %}"
        "{% endfor %}"
    )


IMAGE_CHAT_TEMPLATE = image_chat_template(IMAGE_TOKEN)


def builtin_model_path(model_id: str) -> Path:
    """Directory of a built-in model, complete and current: built on first use by one of the processes that ask for
    it at once, and again when what it is built from has changed (:func:`build_spec`)."""
    path = demo_model_dir(model_id)
    build_once(path, lambda folder: build_demo_model(folder, model_id), what=f"the built-in {path.name} model",
               spec=build_spec(model_id))
    return path


def build_spec(model_id: str) -> str:
    """A digest of everything a built-in model is built from: its config, image settings and class, and this
    module's code (tokenizer, templates, processor).  A home built by an earlier tuner is rebuilt, never loaded with
    a config or a tokenizer the recipe's plan and data checks no longer describe."""
    model = builtin_model(model_id)
    inputs = json.dumps([model.full_config(), model.image, model.architecture], sort_keys=True, default=str)
    return hashlib.sha256(inputs.encode() + Path(__file__).read_bytes()).hexdigest()


def is_current(model_id: str) -> bool:
    """Whether the built-in model is built, from the inputs this tuner builds it from (no build is started)."""
    return is_built(demo_model_dir(model_id), build_spec(model_id))


def train_tokenizer(image_tokens: dict[str, str] | None = None, chat_template: str = CHAT_TEMPLATE):
    """A character-level tokenizer, trained with the tokenizers library on the characters the demo uses; with
    ``image_tokens`` ({"image_token": "<image>"}: the attribute a processor reads, the token), those too, numbered
    in order after the demo's special tokens (special: never split, never decoded into an answer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    corpus = [string.ascii_letters + string.digits + string.punctuation + " \n", "<|user|><|assistant|><|system|>"]
    special = SPECIAL_TOKENS + list((image_tokens or {}).values())
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=special, min_frequency=1))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        **({"extra_special_tokens": image_tokens} if image_tokens else {}),
    )
    assert [fast.convert_tokens_to_ids(token) for token in special] == list(range(len(special)))
    fast.chat_template = chat_template
    return fast


def build_demo_model(path: Path, model_id: str = DEMO_MODEL_ID) -> None:
    """Build the built-in model ``model_id`` in the folder ``path`` in a fresh Python process (:func:`save_demo_model`).

    Whichever rank gets there first builds it, and inside a rank transformers would save something else: with a
    process group up, ``save_pretrained`` writes no weights on any rank but 0 (the folder then held only the
    tokenizer), and a ZeRO-3 configuration partitions a model as it is made.  A process of its own has neither.
    """
    built = subprocess.run([sys.executable, "-m", __name__, str(path), model_id])
    if built.returncode != 0:
        raise OSError(f"building the built-in model {model_id} in {path} failed (exit code {built.returncode}); its error "
                      "is printed above.")


def save_demo_model(path: Path, model_id: str = DEMO_MODEL_ID) -> None:
    """Build the built-in model ``model_id`` with random weights (seeded) and save it, with its tokenizer (and an
    image-text model's processor), in the folder ``path``; its class is the one its config's auto class builds."""
    import torch
    import transformers

    from tuner.catalog.model_classes import auto_class_for

    built = builtin_model(model_id)
    tokenizer = (train_tokenizer({"image_token": IMAGE_TOKEN}, IMAGE_CHAT_TEMPLATE) if built.image else
                 train_tokenizer())
    assert len(tokenizer) == built.vocab_size, (len(tokenizer), built.vocab_size)
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id)
    config_dict = built.full_config()
    if built.image:  # the ids belong to the language model
        config_dict["text_config"] = {**config_dict["text_config"], **special}
    config = transformers.AutoConfig.for_model(**{**config_dict, **({} if built.image else special)})
    torch.manual_seed(0)
    model = getattr(transformers, auto_class_for(config_dict)).from_config(config)
    assert type(model).__name__ == built.architecture, (type(model).__name__, built.architecture)
    model.save_pretrained(path)
    if built.image:
        _processor(tokenizer, built.image).save_pretrained(path)
    else:
        tokenizer.save_pretrained(path)


def _processor(tokenizer, image: dict):
    """LLaVA's processor over the character tokenizer, with CLIP's image processor (its Pillow backend: no
    torchvision needed) resizing every image to the tower's square."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    side = image["size"]
    images = CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=image["patch_size"],
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=IMAGE_CHAT_TEMPLATE)


if __name__ == "__main__":  # the process build_demo_model starts
    save_demo_model(Path(sys.argv[1]), *sys.argv[2:3])
