"""Batch answers: a JSON-lines file of prompts in, one JSON line out per input line, in the same order.

A malformed line does not stop the batch: it is reported with its line number and written to the output
as ``{"line": N, "error": ...}`` in its place, so output line i always answers input line i.
Blank lines are not inputs and are skipped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tuner.data.sources import DataError

EXPECTED = "expected an object with 'prompt' (text) or 'messages' (a list of {role, content} ending with a user turn)"


@dataclass(frozen=True)
class PromptLine:
    line: int
    messages: list[dict[str, str]]
    record: dict


@dataclass(frozen=True)
class BadLine:
    line: int
    reason: str

    def message(self, path: str | Path) -> str:
        return f"{path}:{self.line}: {self.reason}"


def parse_prompt_line(text: str, line: int) -> PromptLine | BadLine:
    """One input line: {"prompt": "..."} or {"messages": [...]}; other keys (ids) are copied to the answer."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return BadLine(line, f"not valid JSON ({exc.msg} at column {exc.colno}); {EXPECTED}.")
    if not isinstance(record, dict):
        return BadLine(line, f"got a JSON {type(record).__name__}; {EXPECTED}.")
    if isinstance(record.get("prompt"), str):
        return PromptLine(line, [{"role": "user", "content": record["prompt"]}], record)
    messages = record.get("messages")
    well_formed = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)
    if not well_formed or messages[-1]["role"] != "user":
        return BadLine(line, f"{EXPECTED}.")
    return PromptLine(line, [{"role": m["role"], "content": m["content"]} for m in messages], record)


def read_prompt_file(path: str | Path) -> tuple[list[PromptLine], list[BadLine]]:
    """Every non-blank line parsed; bad lines are collected, not raised."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"--input {path}: no such file.") from None
    except UnicodeDecodeError:
        raise DataError(f"--input {path}: not UTF-8 text; save the file as UTF-8 JSON lines.") from None
    good: list[PromptLine] = []
    bad: list[BadLine] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            parsed = parse_prompt_line(raw, number)
            (good if isinstance(parsed, PromptLine) else bad).append(parsed)
    return good, bad


def answer_records(prompts: list[PromptLine], answers: list[str], bad: list[BadLine]) -> list[dict]:
    """Output records in input-line order: the input's fields plus its answer, or the reason it was skipped."""
    records = {p.line: {**p.record, "line": p.line, "answer": a} for p, a in zip(prompts, answers, strict=True)}
    records.update({b.line: {"line": b.line, "error": b.reason} for b in bad})
    return [records[line] for line in sorted(records)]


def write_answers(path: str | Path, records: list[dict]) -> Path:
    from tuner.fileio import atomic_write_text

    return atomic_write_text(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
