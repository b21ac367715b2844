"""Preference data for dpo and kto: the two layouts, the checks of each row, and the tokens TRL trains on.

``preference`` (DPO): ``prompt``, ``chosen``, ``rejected``, each text or a list of role/content messages.  A
conversation may leave ``prompt`` out: the turns chosen and rejected share are then the prompt (TRL's
``extract_prompt``).  ``unpaired_preference`` (KTO): ``prompt``, ``completion`` and ``label`` (true: desirable).

TRL tokenises these itself; :func:`encode_completions` follows ``DPOTrainer``/``KTOTrainer._prepare_dataset``
(TRL 1.16) so that ``tuner data preview`` shows the tokens training sees (a test compares the two).
"""
from __future__ import annotations

from typing import Any

PREFERENCE_COLUMNS = {
    "preference": {"chosen", "rejected"},  # and prompt, which conversations may carry in their shared opening turns
    "unpaired_preference": {"prompt", "completion", "label"},
}
COMPLETION_KEYS = {"preference": ("chosen", "rejected"), "unpaired_preference": ("completion",)}


def is_messages(value: Any) -> bool:
    """A non-empty list of {role, content} messages with string values."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"] and isinstance(m.get("content"), str)
        for m in value)


def _empty(value: Any) -> bool:
    if isinstance(value, str):
        return not value.strip()
    return not any(message["content"].strip() for message in value)


def _normalised(value: Any):
    if isinstance(value, str):
        return value.strip()
    return [(message["role"], message["content"].strip()) for message in value]


def common_prefix_length(items: list, others: list) -> int:
    """How many leading items two lists share: the opening messages of two conversations (the implicit prompt
    TRL's ``extract_prompt`` takes), or the token ids where prompt and prompt + answer diverge."""
    count = 0
    for mine, theirs in zip(items, others):
        if mine != theirs:
            break
        count += 1
    return count


def with_prompt(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample with an explicit prompt: a conversation pair without one gives up its shared opening turns."""
    if sample.get("prompt") is not None:
        return sample
    shared = common_prefix_length(sample["chosen"], sample["rejected"])
    return {**sample, "prompt": sample["chosen"][:shared], "chosen": sample["chosen"][shared:],
            "rejected": sample["rejected"][shared:]}


def preference_problem(sample: dict[str, Any], data_format: str) -> str | None:
    """Why one row cannot be trained on in this layout, or None when it can."""
    keys = COMPLETION_KEYS[data_format]
    for key in keys:
        value = sample.get(key)
        if not (isinstance(value, str) or is_messages(value)):
            return f"'{key}' is missing, or neither text nor a list of role/content messages"
    conversational = isinstance(sample[keys[0]], list)
    if any(isinstance(sample[key], list) != conversational for key in keys):
        return f"{' and '.join(repr(k) for k in keys)} mix text and messages; use one kind for all"
    prompt = sample.get("prompt")
    if prompt is None and data_format == "preference" and conversational:
        shared = common_prefix_length(sample["chosen"], sample["rejected"])
        if shared == 0:
            return "no 'prompt', and 'chosen' and 'rejected' share no opening turn to take it from"
        sample = with_prompt(sample)
        prompt = sample["prompt"]
    elif prompt is None:
        return "'prompt' is missing" + (" (text pairs need it; conversations may carry it in their shared opening turns)"
                                         if data_format == "preference" else "")
    elif not (is_messages(prompt) if conversational else isinstance(prompt, str)):
        return f"'prompt' must be {'a list of role/content messages' if conversational else 'text'} like " \
               f"'{keys[0]}'"
    if _empty(prompt):
        return "'prompt' is empty"
    for key in keys:
        if _empty(sample[key]):
            return f"'{key}' is empty"
    if data_format == "preference" and _normalised(sample["chosen"]) == _normalised(sample["rejected"]):
        return "'chosen' and 'rejected' are the same answer, so there is no preference to learn"
    if data_format == "unpaired_preference" and not isinstance(sample.get("label"), bool):
        return "'label' must be true (desirable) or false (undesirable)"
    return None


def _tokenize(tokenizer, value, chat_template: str, **kwargs) -> list[int]:
    """TRL's ``_tokenize``: the chat template for messages, the tokenizer's own call for text."""
    from tuner.data.chat_template import chat_ids

    if isinstance(value, list):
        return chat_ids(tokenizer, value, chat_template, **kwargs)
    return list(tokenizer(text=value)["input_ids"])


def encode_completions(sample: dict[str, Any], data_format: str, tokenizer) -> tuple[list[int], list[list[int]]]:
    """(prompt ids, ids of each completion) as TRL's trainers tokenise a row: text completions get EOS appended,
    the completion starts where prompt and prompt + completion diverge."""
    from tuner.data.formats import DEFAULT_CHAT_TEMPLATE

    sample = with_prompt(sample)
    prompt = sample["prompt"]
    completions = [sample[key] for key in COMPLETION_KEYS[data_format]]
    template = tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE
    if isinstance(prompt, list):
        prompt_ids = _tokenize(tokenizer, prompt, template, add_generation_prompt=True)
        full = [_tokenize(tokenizer, prompt + completion, template) for completion in completions]
    else:
        eos = tokenizer.eos_token or ""
        full = [_tokenize(tokenizer, prompt + (c if c.endswith(eos) else c + eos), template) for c in completions]
        prompt_ids = _tokenize(tokenizer, prompt, template)
    prompt_length = min(common_prefix_length(prompt_ids, ids) for ids in full)
    return prompt_ids[:prompt_length], [ids[prompt_length:] for ids in full]


def render_rows_within_bounds(rows, data_format: str, tokenizer) -> None:
    """Render every conversational row once through tuner's bounded renderer (:mod:`tuner.data.chat_template`), as
    TRL's trainers will with ``apply_chat_template``: the sandbox is deterministic, so a template that stays within
    the bounds here stays within them in TRL, and one that does not is refused (naming its file) before TRL starts."""
    for sample in rows:
        encode_completions(sample, data_format, tokenizer)


def prompt_and_chosen(sample: dict[str, Any], tokenizer) -> tuple[str, str]:
    """The text a model is given for a preference row, and the chosen answer's text (what generation should give)."""
    from tuner.data.chat_template import render_chat
    from tuner.data.formats import DEFAULT_CHAT_TEMPLATE

    sample = with_prompt(sample)
    if isinstance(sample["prompt"], str):
        return sample["prompt"], sample["chosen"]
    prompt = render_chat(tokenizer, sample["prompt"], tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE,
                         add_generation_prompt=True)
    return prompt, "".join(message["content"] for message in sample["chosen"])
