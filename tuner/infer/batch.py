"""Batch answers: a JSON-lines file of prompts in, one JSON line out per input line, in the same order.

A malformed line does not stop the batch: it is reported with its line number and written to the output
as ``{"line": N, "error": ...}`` in its place, so output line i always answers input line i.
Blank lines are not inputs and are skipped.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tuner.data.formats import CHAT_ROLES
from tuner.data.sources import DataError
from tuner.reason import library_words

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
    except RecursionError:
        return BadLine(line, f"nested too deeply; {EXPECTED}.")
    if not isinstance(record, dict):
        return BadLine(line, f"got a JSON {type(record).__name__}; {EXPECTED}.")
    if isinstance(record.get("prompt"), str):
        return PromptLine(line, [{"role": "user", "content": record["prompt"]}], record)
    messages = record.get("messages")
    well_formed = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)
    if not well_formed or messages[-1]["role"] != "user":
        return BadLine(line, f"{EXPECTED}.")
    unknown = next((m["role"] for m in messages if m["role"] not in CHAT_ROLES), None)
    if unknown is not None:
        return BadLine(line, f"role {unknown!r} is not one of {', '.join(CHAT_ROLES)}.")
    return PromptLine(line, [{"role": m["role"], "content": m["content"]} for m in messages], record)


def read_prompt_file(path: str | Path) -> tuple[list[PromptLine], list[BadLine]]:
    """Every non-blank line parsed, each read up to the row limit; bad lines are collected, not raised."""
    from tuner.data.sources import bounded_lines, decode_line
    from tuner.fileio import NotARegularFile

    path = Path(path)
    good: list[PromptLine] = []
    bad: list[BadLine] = []
    try:
        for number, raw, size in bounded_lines(path, pipes=True):
            text, problem = decode_line(raw, size)
            if problem:
                bad.append(BadLine(number, f"{problem}."))
            elif text.strip():
                parsed = parse_prompt_line(text, number)
                (good if isinstance(parsed, PromptLine) else bad).append(parsed)
    except FileNotFoundError:
        raise DataError(f"--input {path}: no such file.") from None
    except NotARegularFile as exc:
        raise DataError(f"--input {path}: not a regular file ({exc.kind}); give the JSON-lines file of prompts.") from None
    return good, bad


def answer_record(prompt: PromptLine | BadLine, answer: str | None = None) -> dict:
    """The output record of one input line: its fields plus its answer, or the reason it was not answered."""
    if isinstance(prompt, BadLine):
        return {"line": prompt.line, "error": prompt.reason}
    return {**prompt.record, "line": prompt.line, "answer": answer}


def answers_file_problem(path: Path) -> str | None:
    """Why ``path`` does not look like an answers file tuner wrote (each line {"line": N, "answer" | "error": ...}),
    judged from its first line; None when it does (or is empty)."""
    from tuner.data.sources import MAX_ROW_BYTES
    from tuner.fileio import open_input

    with open_input(path, pipes=False) as stream:
        first = stream.readline(MAX_ROW_BYTES)
    if not first.strip():
        return None
    try:
        record = json.loads(first)
    except (ValueError, RecursionError):
        return "its first line is not JSON"
    if isinstance(record, dict) and isinstance(record.get("line"), int) and ("answer" in record or "error" in record):
        return None
    return 'its first line is not {"line": N, "answer": ...}'


def check_output(output: Path, prompts: Path, force: bool) -> None:
    """Refuse, before a model is loaded, an --output that would overwrite the prompts, a folder, a link, an existing
    file without ``force``, or (with it) a file that is not tuner's answers."""
    from tuner.fileio import FILE, entry_kind

    where = f"--output {output}"
    if output.is_symlink():
        raise DataError(f"{where}: is a symbolic link (to {os.readlink(output)}); give the file itself, or another.")
    if output.is_dir():
        raise DataError(f"{where}: is a folder; --output names the answers file (JSON lines).")
    if output.exists() and entry_kind(output) != FILE:
        raise DataError(f"{where}: is {entry_kind(output)}, not a file; --output names the answers file (JSON lines).")
    if output.exists() and prompts.exists() and output.samefile(prompts):
        raise DataError(f"{where}: is the --input file; the answers would replace the prompts. Choose another --output.")
    if not output.exists():
        return
    if not force:
        raise DataError(f"{where}: the file exists; pass --force to overwrite it.")
    problem = answers_file_problem(output)
    if problem:
        raise DataError(f"{where}: not an answers file tuner wrote ({problem}); --force replaces only tuner's answers. "
                        "Choose another --output, or move the file away.")


def write_answers(path: str | Path, items: list[PromptLine | BadLine], answer_batch, batch_size: int,
                  on_bad=None) -> int:
    """Answer ``items`` (in input-line order) a batch at a time and write each record as it comes, so a batch that
    stops half-way (killed, out of memory) keeps every answer before it.  ``answer_batch(prompts) -> answers``; a
    batch whose generation fails is asked again line by line, and a line that fails alone gets an error record
    (``on_bad(BadLine)`` is told).  Returns the number of answers written."""
    from tuner.fileio import streamed_text

    answered = 0
    with streamed_text(path) as stream:
        pending: list[PromptLine | BadLine] = []

        def flush() -> None:
            nonlocal answered
            asked = [item for item in pending if isinstance(item, PromptLine)]
            answers = dict(zip((item.line for item in asked), _answers_or_errors(asked, answer_batch, on_bad)))
            for item in pending:
                outcome = answers.get(item.line)
                record = answer_record(outcome if isinstance(outcome, BadLine) else item, outcome)
                answered += "answer" in record
                stream.write(json.dumps(record, ensure_ascii=False) + "\n")
            stream.flush()
            pending.clear()

        for item in items:
            pending.append(item)
            if sum(isinstance(entry, PromptLine) for entry in pending) >= batch_size:
                flush()
        flush()
    return answered


def _answers_or_errors(asked: list[PromptLine], answer_batch, on_bad) -> list[str | BadLine]:
    from tuner.infer.generate import GENERATION_FAILURES

    if not asked:
        return []
    try:
        return list(answer_batch(asked))
    except GENERATION_FAILURES as exc:
        if len(asked) > 1:  # one line may be the cause: ask each alone
            return [outcome for item in asked for outcome in _answers_or_errors([item], answer_batch, on_bad)]
        bad = BadLine(asked[0].line, f"generation failed: {type(exc).__name__}: {library_words(exc)}")
        if on_bad:
            on_bad(bad)
        return [bad]
