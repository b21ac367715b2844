"""A Hugging Face tokenizer as GGUF metadata (``tokenizer.ggml.*``), for the kinds both llama.cpp and transformers'
GGUF reader rebuild exactly.

- **Byte-level BPE** (Llama 3, Qwen2/Qwen3, GPT-2 style): ``gpt2`` with the merges, and the pre-tokenizer's split
  named as llama.cpp names it (``llama-bpe``, ``qwen2``, ...; the names and their expressions are transformers'
  ``GGUF_PRE_TOKENIZER_SPLITS``, the table its reader splits text with).  A split that table does not know is
  refused: llama.cpp would cut the text differently and the ids would not match.
- **SentencePiece-style BPE** with byte fallback (Mistral, Llama 2, Gemma): ``llama``; llama.cpp joins pieces by
  score, so each token scores minus the rank of the merge that makes it, and the merges go in too (transformers'
  reader uses them when present).
- **One token per character** (the built-in demo's word-level tokenizer over single ASCII characters): byte-level
  BPE with no merges, which cuts text into the same characters, spelled in the byte alphabet.  A character the
  vocabulary lacks becomes ``<unk>`` in tuner and is dropped by GGUF readers (they have no unknown token for BPE).

Anything else (a word-level vocabulary of longer words, WordPiece, Unigram) is refused, naming the kind.
Special tokens are ``CONTROL``, other added tokens ``USER_DEFINED``; embedding rows past the vocabulary get
``[PAD<i>]`` tokens of type ``UNUSED``, as llama.cpp's converter writes them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from tuner.export import ExportRefused

UNUSED_TOKEN = "[PAD{}]"


@dataclass
class GGUFVocab:
    model: str  # tokenizer.ggml.model: gpt2 or llama
    tokens: list[str]
    types: list[int]  # gguf.TokenType values
    merges: list[str] = field(default_factory=list)
    scores: list[float] | None = None
    pre: str | None = None  # tokenizer.ggml.pre
    add_space_prefix: bool | None = None


def _backend(tokenizer) -> dict:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportRefused(f"the tokenizer ({type(tokenizer).__name__}) has no tokenizer.json (a slow, Python-only "
                            "tokenizer); GGUF export needs the fast tokenizer's vocabulary and merges.")
    return json.loads(backend.to_str())


def _merge_strings(merges: list) -> list[str]:
    """Merges as llama.cpp stores them, "left right", a space inside a part written as U+0120 (as gguf-py does)."""
    pairs = [merge.split(" ", 1) if isinstance(merge, str) else merge for merge in merges]
    return [" ".join(part.replace(" ", chr(ord(" ") + 256)) for part in pair) for pair in pairs]


def _split_regexes(pre_tokenizer: dict | None) -> list[str]:
    if not pre_tokenizer:
        return []
    parts = pre_tokenizer.get("pretokenizers", [pre_tokenizer])
    return [part["pattern"]["Regex"] for part in parts if part.get("type") == "Split" and "Regex" in part.get("pattern", {})]


def _pre_tokenizer_name(pre_tokenizer: dict | None) -> str:
    """llama.cpp's name of the text split a byte-level BPE tokenizer uses, from transformers' GGUF table."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    regexes = _split_regexes(pre_tokenizer)
    if not regexes:
        parts = (pre_tokenizer or {}).get("pretokenizers", [pre_tokenizer or {}])
        if any(part.get("type") == "ByteLevel" and part.get("use_regex", True) for part in parts):
            return "gpt-2"  # ByteLevel's own GPT-2 split
        raise ExportRefused("the byte-level BPE tokenizer has no split expression GGUF readers can name; llama.cpp "
                            "would cut text differently.")
    for name, regex in GGUF_PRE_TOKENIZER_SPLITS.items():
        if regex in regexes:
            return name
    raise ExportRefused(f"the tokenizer splits text with {regexes[0][:80]!r}, which is not one llama.cpp names "
                        f"(known: {', '.join(sorted(set(GGUF_PRE_TOKENIZER_SPLITS)))}); its GGUF would tokenize "
                        "differently, so it is not exported.")


def _byte_spelling() -> dict[int, str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def gguf_vocab(tokenizer, rows: int) -> GGUFVocab:
    """The tokenizer's GGUF form for a model with ``rows`` embedding rows; :class:`ExportRefused` when it has none."""
    import gguf

    backend = _backend(tokenizer)
    model = backend.get("model", {})
    kind = model.get("type")
    by_id = {index: text for text, index in tokenizer.get_vocab().items()}
    added = {token.content: token for token in tokenizer.added_tokens_decoder.values()}
    if len(by_id) > rows:
        raise ExportRefused(f"the tokenizer has {len(by_id)} tokens but the model only {rows} embedding rows.")
    missing = [index for index in range(len(by_id)) if index not in by_id]
    if missing:
        raise ExportRefused(f"the tokenizer's ids have gaps (no token {missing[0]}); GGUF lists tokens by id.")

    def token_type(index: int, text: str) -> int:
        if text in added:
            return gguf.TokenType.CONTROL if added[text].special else gguf.TokenType.USER_DEFINED
        return gguf.TokenType.NORMAL

    decoder = (backend.get("decoder") or {}).get("type")
    if kind == "WordLevel":
        spelling = _byte_spelling()
        tokens, types = [], []
        for index in range(len(by_id)):
            text = by_id[index]
            if text not in added and len(text.encode("utf-8")) != 1:
                raise ExportRefused(f"the word-level tokenizer has a token of several characters ({text!r}); only a "
                                    "vocabulary of single characters has a GGUF form (byte-level BPE without merges).")
            tokens.append(text if text in added else spelling[text.encode("utf-8")[0]])
            types.append(token_type(index, text))
        vocab = GGUFVocab("gpt2", tokens, types, merges=[], pre="default")
    elif kind == "BPE" and not model.get("byte_fallback") and decoder == "ByteLevel":
        tokens = [by_id[index] for index in range(len(by_id))]
        vocab = GGUFVocab("gpt2", tokens, [token_type(i, t) for i, t in enumerate(tokens)],
                          merges=_merge_strings(model.get("merges", [])), pre=_pre_tokenizer_name(backend.get("pre_tokenizer")))
    elif kind == "BPE" and model.get("byte_fallback"):
        vocab = _sentencepiece_bpe(backend, by_id, token_type)
    else:
        raise ExportRefused(f"the tokenizer is {kind or 'of an unknown kind'}"
                            f"{' with a ' + decoder + ' decoder' if decoder else ''}; GGUF export writes byte-level "
                            "BPE, SentencePiece-style BPE and single-character vocabularies.")
    for index in range(len(vocab.tokens), rows):
        vocab.tokens.append(UNUSED_TOKEN.format(index))
        vocab.types.append(gguf.TokenType.UNUSED)
        if vocab.scores is not None:
            vocab.scores.append(-10000.0)
    return vocab


def _sentencepiece_bpe(backend: dict, by_id: dict[int, str], token_type) -> GGUFVocab:
    import re

    import gguf

    merges = _merge_strings(backend["model"].get("merges", []))
    rank = {merge.replace(" ", ""): position for position, merge in reversed(list(enumerate(merges)))}
    tokens = [by_id[index] for index in range(len(by_id))]
    types = []
    for index, text in enumerate(tokens):
        kind = token_type(index, text)
        types.append(gguf.TokenType.BYTE if kind == gguf.TokenType.NORMAL and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text)
                     else kind)
    scores = [-float(rank[text]) if text in rank else 0.0 for text in tokens]
    pre = backend.get("pre_tokenizer") or {}
    normalizer = json.dumps(backend.get("normalizer") or {})
    prefix = pre.get("prepend_scheme", "never") in ("first", "always") or '"Prepend"' in normalizer
    return GGUFVocab("llama", tokens, types, merges=merges, scores=scores, add_space_prefix=prefix)


def write_vocab(writer, vocab: GGUFVocab, tokenizer) -> None:
    """The vocabulary, special tokens, whether BOS/EOS are added, and the chat template."""
    import gguf

    writer.add_tokenizer_model(vocab.model)
    if vocab.pre:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    # gguf-py writes no empty array; llama.cpp needs the key for a BPE vocabulary even without merges
    writer.add_key_value(gguf.Keys.Tokenizer.MERGES, vocab.merges, gguf.GGUFValueType.ARRAY,
                         sub_type=gguf.GGUFValueType.STRING)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    for kind in ("bos", "eos", "unk", "pad"):
        token_id = getattr(tokenizer, f"{kind}_token_id", None)
        if isinstance(token_id, int):
            getattr(writer, f"add_{kind}_token_id")(token_id)
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    writer.add_add_bos_token(len(probe) > len(plain) and probe[0] == tokenizer.bos_token_id)
    writer.add_add_eos_token(len(probe) > len(plain) and probe[-1] == tokenizer.eos_token_id)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
