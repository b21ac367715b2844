"""Prompt-only data for grpo: the layout, the check of each row, the reward inputs, and the tokens TRL generates from.

``prompt`` (GRPO): a ``prompt`` column, text or a list of role/content messages ending with a turn for the model to
answer; every other column is a reward input, handed to the rewards beside each completion (an ``answer`` column for
exact_match, say).  TRL tokenises the prompts itself; :func:`prompt_ids` follows ``GRPOTrainer._tokenize_prompts``
(TRL 1.16), so the prompt-length filter and ``tuner data preview`` count the tokens generation starts from.
"""
from __future__ import annotations

from typing import Any

from tuner.data.formats import CHAT_ROLES
from tuner.data.preference import is_messages

PROMPT_COLUMNS = {"prompt": {"prompt"}}
ROW_COLUMN = "tuner_row"  # added to the training split: each prompt's row in the data (1 = the first), for messages


def prompt_problem(sample: dict[str, Any], data_format: str = "prompt") -> str | None:
    """Why one row cannot be a prompt, or None when it can."""
    prompt = sample.get("prompt")
    if isinstance(prompt, str):
        return "'prompt' is empty" if not prompt.strip() else None
    if not is_messages(prompt):
        return "'prompt' is missing, or neither text nor a list of role/content messages"
    roles = [message["role"] for message in prompt]
    unknown = [role for role in roles if role not in CHAT_ROLES]
    if unknown:
        return f"'prompt' has a message of role {unknown[0]!r}; use {', '.join(CHAT_ROLES)}"
    if roles[-1] == "assistant":
        return "'prompt' ends with the assistant's turn; end it with the turn the model answers (the completion is " \
               "the next assistant turn)"
    if not any(message["content"].strip() for message in prompt):
        return "'prompt' is empty"
    return None


def reward_inputs(sample: dict[str, Any]) -> dict[str, Any]:
    """The columns of a row that reach the rewards beside each completion: all but the prompt and tuner's own."""
    return {key: value for key, value in sample.items() if key not in ("prompt", ROW_COLUMN)}


def prompt_ids(prompt, tokenizer) -> list[int]:
    """The tokens generation starts from, as TRL's GRPOTrainer makes them: the chat template with the generation
    prompt for messages, the tokenizer's own call (special tokens included) for text."""
    from tuner.data.chat_template import chat_ids
    from tuner.data.formats import DEFAULT_CHAT_TEMPLATE

    if isinstance(prompt, list):
        return chat_ids(tokenizer, prompt, tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE, add_generation_prompt=True)
    return list(tokenizer(text=prompt)["input_ids"])


def prompt_text(prompt, tokenizer) -> str:
    """What the model is given for a prompt: the rendered chat template, or the text itself."""
    from tuner.data.chat_template import render_chat
    from tuner.data.formats import DEFAULT_CHAT_TEMPLATE

    if isinstance(prompt, str):
        return prompt
    return render_chat(tokenizer, prompt, tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE, add_generation_prompt=True)
