"""The built-in demo model: a tiny Llama with a character tokenizer trained on the fly.

Nothing can be downloaded here, so tuner builds its own default once, saves it in
Hugging Face format under ``$TUNER_HOME/models/``, and from then on it is loaded
through the ordinary ``from_pretrained`` path like any user model.
"""
from __future__ import annotations

import os
import string
from pathlib import Path

BUILTIN_PREFIX = "builtin:"
DEMO_MODEL = "demo"

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
# A compact template keeps the demo's sequences short: "reverse\nabc=cba</s>".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ message['content'] + '=' }}{% endif %}"
    "{% endfor %}"
)


def tuner_home() -> Path:
    """Where tuner caches what it builds: ``$TUNER_HOME`` or the user's cache directory."""
    configured = os.environ.get("TUNER_HOME")
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("tuner"))


def is_builtin(model_id: str) -> bool:
    return model_id.startswith(BUILTIN_PREFIX)


def builtin_model_path(model_id: str) -> Path:
    """Directory of a built-in model, building it on first use."""
    name = model_id.removeprefix(BUILTIN_PREFIX)
    if name != DEMO_MODEL:
        raise ValueError(f"unknown built-in model {model_id!r}; the built-in model is {BUILTIN_PREFIX}{DEMO_MODEL}")
    path = tuner_home() / "models" / name
    if not (path / "config.json").is_file():
        build_demo_model(path)
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


def build_demo_model(path: Path) -> Path:
    """Build the demo model with random weights (seeded) and save it atomically at ``path``."""
    import shutil
    import tempfile

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
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if path.exists():  # another process finished first
            shutil.rmtree(staging)
        else:
            staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path
