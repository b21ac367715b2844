"""The prompt format a run was trained on, so ``tuner chat`` / ``tuner infer`` ask it the way it learned.

Instruction data is rendered as the instruction followed by the input.  When every training sample
shares one instruction (the demo's ``reverse``), that instruction is the task: a message is its input,
so "hello" reaches the demo as ``reverse\\nhello``.  Chat data goes through the chat template.
"""
from __future__ import annotations

from dataclasses import dataclass

from tuner.recipe.schema import Recipe

SAMPLES_READ = 1000  # enough to tell one shared instruction from many


@dataclass(frozen=True)
class PromptFormat:
    data_format: str  # the recipe's data.format, resolved from the data when it says auto
    instruction: str | None = None  # the one instruction every sample shares (instruction data only)
    note: str = ""  # how messages are sent, for the user
    system: str | None = None  # the system message every chat sample read opens with (what an export sets)


def trained_prompt_format(recipe: Recipe, instruction: str | None = None) -> PromptFormat:
    """Read the recipe's training data (the first samples) to learn its layout and shared instruction.

    ``instruction`` (``--instruction``) replaces what the data says.  Data that cannot be read here
    leaves the recipe's format, and a message's first line is its instruction.
    """
    from tuner.data.prepare import columns_of, first_rows, resolve_format
    from tuner.data.sources import DataError, load_split

    data_format, streaming = recipe.data.format, recipe.data.streaming
    try:  # streamed data: only its first samples are read
        dataset = load_split(recipe.data.source, recipe.data.split, streaming, scan=not streaming).dataset
        data_format = resolve_format(data_format, columns_of(dataset))
        rows = first_rows(dataset, SAMPLES_READ)
        found = {row["instruction"] for row in rows} if data_format == "instruction" else set()
    except DataError as exc:
        if data_format != "instruction":
            return PromptFormat(data_format)
        return PromptFormat(data_format, instruction, f"the training data cannot be read here ({exc}); put the "
                                                      "instruction on a message's first line")
    if data_format == "chat":
        return PromptFormat(data_format, system=shared_system_prompt(rows))
    if data_format != "instruction":
        return PromptFormat(data_format)
    shared = instruction or (found.pop() if len(found) == 1 else None)
    if shared:
        return PromptFormat(data_format, shared, f"instruction {shared!r} with each message as its input, "
                                                 "one message at a time, as the run was trained")
    return PromptFormat(data_format, None, "instruction data: a message's first line is the instruction, the rest "
                                           "its input, one message at a time, as the run was trained")


def shared_system_prompt(rows) -> str | None:
    """The system message every one of ``rows`` (chat samples) opens with, or None when they do not share one."""
    openings = {row["messages"][0]["content"] if row["messages"] and row["messages"][0]["role"] == "system" else None
                for row in rows}
    return openings.pop() if len(openings) == 1 else None
