"""The built-in demo model: a tiny Llama with a character tokenizer trained on the fly.

Nothing can be downloaded here, so tuner builds its own default once, saves it in
Hugging Face format under ``$TUNER_HOME/models/``, and from then on it is loaded
through the ordinary ``from_pretrained`` path like any user model.  Ranks and machines that share the home build
it once between them (:func:`tuner.build_once.build_once`).
"""
from __future__ import annotations

import string
from pathlib import Path

from tuner.build_once import build_once
from tuner.catalog.demo import DEMO_CONFIG, SPECIAL_TOKENS, demo_model_dir

# A compact template keeps the demo's sequences short: "reverse\nabc=cba</s>".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ message['content'] + '=' }}{% endif %}"
    "{% endfor %}"
)


def builtin_model_path(model_id: str) -> Path:
    """Directory of a built-in model, complete: built on first use by one of the processes that ask for it at once."""
    path = demo_model_dir(model_id)
    build_once(path, build_demo_model, what="the built-in demo model")
    return path


def _train_tokenizer():
    """A character-level tokenizer, trained with the tokenizers library on the characters the demo uses."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    corpus = [string.ascii_letters + string.digits + string.punctuation + " \n", "<|user|><|assistant|><|system|>"]
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, min_frequency=1))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_demo_model(path: Path) -> None:
    """Build the demo model with random weights (seeded) and save it, with its tokenizer, in the folder ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **DEMO_CONFIG,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
