"""Sample layouts (text, instruction, chat) and how each becomes token ids and loss labels.

A sample is rendered as a list of segments ``(text, trainable)``; tokenising the
segments one by one gives exact label masks without searching for response markers.
"""
from __future__ import annotations

from typing import Any, Iterable

IGNORE_INDEX = -100
TRUNCATED = "truncated"  # the column that flags a sample cut to max_seq_length (kept for preview, not trained on)

# Alpaca's template, used when the tokenizer has no chat template.
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"

# Used for chat data when the tokenizer has none (documented in docs/training.md).
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
# The roles a conversation may use: what chat templates (and tuner's default one) know how to render.
CHAT_ROLES = ("system", "user", "assistant", "tool")


def _jinja_text(text: str) -> str:
    """``text`` as a Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _one_turn_or_chat(one_turn: str) -> str:
    """A template that renders a single message with ``one_turn`` and a conversation with the default chat template."""
    return f"{{% if messages | length == 1 %}}{one_turn}{{% else %}}{DEFAULT_CHAT_TEMPLATE}{{% endif %}}"


_ALPACA_BEFORE, _ALPACA_AFTER = ALPACA_PROMPT.split("{instruction}")
_WITH_INPUT_MIDDLE, _WITH_INPUT_AFTER = ALPACA_PROMPT_WITH_INPUT.split("{instruction}")[1].split("{input}")
# How tuner prompts a model whose tokenizer has no chat template, as chat templates (for servers, which take one):
# one instruction in Alpaca's prompt (its first line the instruction, the rest the input, as training renders an
# instruction sample; see instruction_messages), one text as it is (a base model continues it), conversations in
# the default.
INSTRUCTION_CHAT_TEMPLATE = _one_turn_or_chat(
    "{% set parts = messages[0]['content'].split('\\n', 1) %}"
    "{% if parts | length > 1 and parts[1] %}"
    f"{{{{ {_jinja_text(_ALPACA_BEFORE)} + parts[0] + {_jinja_text(_WITH_INPUT_MIDDLE)} + parts[1]"
    f" + {_jinja_text(_WITH_INPUT_AFTER)} }}}}"
    "{% else %}"
    f"{{{{ {_jinja_text(_ALPACA_BEFORE)} + messages[0]['content'] + {_jinja_text(_ALPACA_AFTER)} }}}}"
    "{% endif %}")
TEXT_CHAT_TEMPLATE = _one_turn_or_chat("{{ messages[0]['content'] }}")


def chat_template_for(tokenizer, data_format: str) -> str:
    """The chat template that prompts the way tuner trains on ``data_format``: the tokenizer's own when it has one;
    without one, the default chat template for chat data, Alpaca's prompt for one instruction (the default for a
    conversation), and the bare text for anything else."""
    if tokenizer.chat_template:
        return tokenizer.chat_template
    return {"chat": DEFAULT_CHAT_TEMPLATE, "instruction": INSTRUCTION_CHAT_TEMPLATE}.get(data_format, TEXT_CHAT_TEMPLATE)


FORMAT_COLUMNS = {
    "chat": {"messages"},
    "instruction": {"instruction", "output"},
    "text": {"text"},
}


def detect_format(columns: Iterable[str]) -> str:
    """Name the layout from a dataset's columns; raise ValueError when none matches.  Image columns come first:
    ``image`` + ``prompt`` + ``answer`` is image_prompt_answer, ``messages`` + ``images`` image_chat (messages
    whose parts name their own images need data.format: image_chat)."""
    present = set(columns)
    if {"image", "prompt", "answer"} <= present:
        return "image_prompt_answer"
    if {"messages", "images"} <= present:
        return "image_chat"
    for name, required in FORMAT_COLUMNS.items():
        if required <= present:
            return name
    raise ValueError(
        f"cannot tell the data format from columns {sorted(present)}: expected 'messages' (chat), "
        "'instruction' and 'output' (instruction) or 'text'; set data.format or rename the columns."
    )


def sample_problem(sample: dict[str, Any], data_format: str) -> str | None:
    """Why one sample cannot be used in the given layout, or None when it can."""
    def is_text(value) -> bool:
        return isinstance(value, str) and value != ""

    if data_format == "text":
        return None if is_text(sample.get("text")) else "'text' is missing or empty"
    if data_format == "instruction":
        for key in ("instruction", "output"):
            if not is_text(sample.get(key)):
                return f"'{key}' is missing or empty"
        if sample.get("input") is not None and not isinstance(sample["input"], str):
            return "'input' is not a string"
        return None
    messages = sample.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' is missing or not a list of messages"
    for message in messages:
        if not isinstance(message, dict) or not is_text(message.get("role")) or not isinstance(message.get("content"), str):
            return "a message lacks a 'role' or a string 'content'"
        if message["role"] not in CHAT_ROLES:
            return f"role {message['role']!r} is not one of {', '.join(CHAT_ROLES)}"
    return None


def problem_rows(batch, data_format: str):
    """The rows of an Arrow record batch that :func:`sample_problem` refuses, found column by column with
    pyarrow.compute (a boolean mask), or None when a column's type needs the row-by-row check (a 'text' column of
    numbers, messages without a string 'role')."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def text_type(arrow_type) -> bool:
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)

    def missing_or_empty(name: str):
        if name not in batch.schema.names:
            return pa.array([True] * batch.num_rows)
        column = batch.column(name)
        if pa.types.is_null(column.type):
            return pa.array([True] * batch.num_rows)
        return pc.fill_null(pc.equal(pc.binary_length(column), 0), True) if text_type(column.type) else None

    if data_format == "text":
        return missing_or_empty("text")
    if data_format == "instruction":
        masks = [missing_or_empty("instruction"), missing_or_empty("output")]
        given = batch.column("input").type if "input" in batch.schema.names else pa.null()
        if None in masks or not (pa.types.is_null(given) or text_type(given)):
            return None
        return pc.or_(*masks)
    messages = batch.column("messages") if "messages" in batch.schema.names else None
    if messages is None or not pa.types.is_list(messages.type) or not pa.types.is_struct(messages.type.value_type):
        return None
    fields = messages.type.value_type
    if any(fields.get_field_index(key) < 0 or not text_type(fields.field(key).type) for key in ("role", "content")):
        return None
    flat = pc.list_flatten(messages)
    role, content = pc.struct_field(flat, "role"), pc.struct_field(flat, "content")
    bad_message = pc.or_(pc.invert(pc.is_in(role, pa.array(CHAT_ROLES))), pc.is_null(content))
    bad = pc.fill_null(pc.equal(pc.list_value_length(messages), 0), True).to_numpy(zero_copy_only=False).copy()
    bad[pc.filter(pc.list_parent_indices(messages), pc.fill_null(bad_message, True)).to_numpy()] = True
    return pa.array(bad)


def instruction_messages(sample: dict[str, Any]) -> list[dict[str, str]]:
    """An instruction sample as a two-turn conversation (user: instruction + input, assistant: output)."""
    user = sample["instruction"]
    if sample.get("input"):
        user = f"{user}\n{sample['input']}"
    return [{"role": "user", "content": user}, {"role": "assistant", "content": sample["output"]}]


def chat_segments(messages: list[dict[str, str]], tokenizer) -> list[tuple[str, bool]]:
    """Render a conversation through the chat template; assistant turns are the trainable segments.

    Each assistant turn is the text the template adds between the prompt for that turn
    (``add_generation_prompt=True``) and the conversation including the turn.
    """
    from tuner.data.chat_template import render_chat

    template = tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE
    render = lambda msgs, gen: render_chat(tokenizer, msgs, template, add_generation_prompt=gen)  # noqa: E731
    segments: list[tuple[str, bool]] = []
    done = ""
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render(messages[:index], True)
        full = render(messages[: index + 1], False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise ValueError("the chat template does not render conversations as growing prefixes; "
                             "set data.train_on_prompt: true to train on the whole text")
        segments += [(prompt[len(done):], False), (full[len(prompt):], True)]
        done = full
    ends_with_answer = bool(messages) and messages[-1]["role"] == "assistant"  # then ``done`` is the whole text
    tail = "" if ends_with_answer else render(messages, False)[len(done):]
    if tail:
        segments.append((tail, False))
    return [segment for segment in segments if segment[0]]


def text_segments(texts: list[str], tokenizer) -> list[list[tuple[str, bool]]]:
    """The segments of text samples: each text and the EOS token, learned."""
    eos = tokenizer.eos_token or ""
    return [[(text + eos, True)] for text in texts]


def sample_segments(sample: dict[str, Any], data_format: str, tokenizer) -> list[tuple[str, bool]]:
    """The segments of one sample in the given layout."""
    if data_format == "text":
        return text_segments([sample["text"]], tokenizer)[0]
    if data_format == "instruction":
        if tokenizer.chat_template:
            return chat_segments(instruction_messages(sample), tokenizer)
        template = ALPACA_PROMPT_WITH_INPUT if sample.get("input") else ALPACA_PROMPT
        return [(template.format(**sample), False), (sample["output"] + (tokenizer.eos_token or ""), True)]
    if data_format == "chat":
        return chat_segments(sample["messages"], tokenizer)
    raise ValueError(f"unknown data format {data_format!r}")


def prompt_text(sample: dict[str, Any], data_format: str, tokenizer) -> str:
    """What a model is given at inference time to answer an instruction/chat sample."""
    segments = sample_segments(sample, data_format, tokenizer)
    first_trainable = next(i for i, (_, trainable) in enumerate(segments) if trainable)
    return "".join(text for text, _ in segments[:first_trainable])


def tokenize_batch(samples: list[list[tuple[str, bool]]], tokenizer, max_length: int, train_on_prompt: bool) -> dict:
    """Token ids and labels (-100 where no loss is computed) of many samples' segments, truncated to ``max_length``;
    whether each was truncated, and whether it ``learns`` (keeps a label after truncation). Every segment of every
    sample goes to the tokenizer in one call (a fast tokenizer encodes a batch in parallel)."""
    texts = [text for segments in samples for text, _ in segments]
    pieces = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
    encoded: dict[str, list] = {"input_ids": [], "labels": [], TRUNCATED: [], "learns": []}
    for segments in samples:
        input_ids: list[int] = []
        labels: list[int] = []
        learns = False
        for _, trainable in segments:
            ids = next(pieces)
            learned = trainable or train_on_prompt
            learns = learns or (learned and ids != [] and len(input_ids) < max_length)
            input_ids += ids
            labels += ids if learned else [IGNORE_INDEX] * len(ids)
        encoded["input_ids"].append(input_ids[:max_length])
        encoded["labels"].append(labels[:max_length])
        encoded[TRUNCATED].append(len(input_ids) > max_length)
        encoded["learns"].append(learns)
    return encoded
