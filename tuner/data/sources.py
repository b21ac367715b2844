"""Load samples from a recipe's data source: local files, the datasets cache, or a built-in task.

A local JSON-lines, JSON or CSV file is scanned row by row before datasets reads it: every row is read up
to :data:`MAX_ROW_BYTES` and no further, decoded as UTF-8, parsed (JSON no deeper than :data:`MAX_ROW_DEPTH`;
CSV with the header's field count), and every problem is named by its file line.  datasets' own errors
name neither the file nor the line, and a 100 MB row would be tokenised whole.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Iterator

from tuner.data.reverse import BUILTIN_DATASETS, builtin_dataset_path
from tuner.fileio import NotARegularFile, TooLarge, open_input, read_limited, special_kind
from tuner.home import tuner_home

FILE_LOADERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
MAX_ROW_BYTES = 8 * 2**20  # one sample (~2M tokens of text): larger rows are refused, never tokenised
MAX_ROW_DEPTH = 16  # a chat sample is three levels deep ({"messages": [{"role": ...}]})
MAX_JSON_ARRAY_BYTES = 2**30  # a JSON array file is read whole (so does datasets); larger data belongs in JSON lines
MAX_LISTED = 5  # problem rows named in one message


class DataError(Exception):
    """The data cannot be used; the message says what to fix."""


def resolve_source(source: str) -> tuple[str, str]:
    """Return (datasets loader, argument): ('json', path), ('parquet', path) or ('hub', name)."""
    if source in BUILTIN_DATASETS:
        return "json", str(builtin_dataset_path(source, tuner_home() / "data"))
    path = Path(source).expanduser()
    if path.suffix.lower() in FILE_LOADERS:
        if not path.exists():
            raise DataError(f"data.source: {source}: no such file.")
        kind = special_kind(path)
        if kind:
            raise DataError(f"data.source: {source}: not a regular file ({kind}); save the data to a file.")
        return FILE_LOADERS[path.suffix.lower()], str(path)
    if path.exists():
        raise DataError(f"data.source: {source}: use a .json, .jsonl, .csv or .parquet file.")
    return "hub", source


def listed(places: list[str]) -> str:
    """'line 3, line 9, ... (and 12 more)': the first few places of a problem."""
    more = f" (and {len(places) - MAX_LISTED} more)" if len(places) > MAX_LISTED else ""
    return ", ".join(places[:MAX_LISTED]) + more


@dataclass
class RowProblems:
    """What is wrong with which rows of one source; raised as one DataError naming the first at its file line."""

    source: str
    lines: list[int] | None = None  # the file line of each dataset row, when the source has lines
    found: list[tuple[int, str, str]] = field(default_factory=list)  # (order, place, reason)

    def add(self, reason: str, line: int) -> None:
        """A problem at a line of the file."""
        self.found.append((line, f"line {line}", reason))

    def add_row(self, index: int, reason: str) -> None:
        """A problem of the dataset's row ``index`` (from 0), named by its file line when the file has lines."""
        if self.lines:
            self.add(reason, self.lines[index])
        else:
            self.found.append((index + 1, f"row {index + 1}", reason))

    def raise_any(self, total: int, fix: str) -> None:
        if not self.found:
            return
        found = sorted(self.found)
        _, place, reason = found[0]
        where = f"{self.source}:{place.removeprefix('line ')}" if place.startswith("line ") else f"{self.source}: {place}"
        more = ""
        if len(found) > 1:
            more = (f"; {len(found) - 1} more of {total} rows cannot be used: "
                    + listed([f"{p} ({r})" for _, p, r in found[1:]]))
        raise DataError(f"data.source: {where}: {reason}{more}. {fix}")


@dataclass
class Samples:
    """A loaded split and, for local JSON and CSV files, the file line where every row starts (for messages)."""

    dataset: object  # datasets.Dataset
    source: str
    lines: list[int] | None = None

    def problems(self) -> RowProblems:
        return RowProblems(self.source, self.lines)


def bounded_lines(path: Path, pipes: bool = False) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number, the line without its ending or None when longer than MAX_ROW_BYTES, its size in bytes).

    Never holds more than MAX_ROW_BYTES of one line: the rest of a longer line is read in chunks and counted.
    """
    with open_input(path, pipes) as stream:
        for number in count(1):
            line = stream.readline(MAX_ROW_BYTES + 2)  # the row and its \r\n
            if not line:
                return
            if not line.endswith(b"\n") and len(line) > MAX_ROW_BYTES:  # cut off: count the rest, keep none of it
                size = len(line)
                while line and not line.endswith(b"\n"):
                    line = stream.readline(2**20)
                    size += len(line)
                yield number, None, size - len(line) + len(line.rstrip(b"\r\n"))
                continue
            line = line.rstrip(b"\r\n")
            yield number, (line if len(line) <= MAX_ROW_BYTES else None), len(line)


def too_large(size: int) -> str:
    """Why a row of ``size`` bytes is refused."""
    return f"the row is {size} bytes; a row may hold {MAX_ROW_BYTES} bytes (split the sample, or shorten it)"


def _not_utf8(raw: bytes, exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 (byte {raw[exc.start]:#04x}); save the file as UTF-8"


def decode_line(raw: bytes | None, size: int) -> tuple[str | None, str | None]:
    """A line from :func:`bounded_lines` as text, or (None, why not): too large, or not UTF-8."""
    if raw is None:
        return None, too_large(size)
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, _not_utf8(raw, exc)


def _depth(value) -> int:
    """How deeply ``value`` nests (a flat object is 1), counting no further than MAX_ROW_DEPTH + 1; no recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= MAX_ROW_DEPTH:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "true/false", type(None): "null"}
_TOO_DEEP = f"nested too deeply (more than {MAX_ROW_DEPTH} levels); a sample is an object of text fields"


def json_row_problem(value, brackets: int) -> str | None:
    """Why a parsed JSON row is not a sample object, or None; ``brackets`` (the [ and { in its text) bounds its depth."""
    if not isinstance(value, dict):
        return f"a JSON {_JSON_KINDS.get(type(value), type(value).__name__)}, not an object"
    if brackets > MAX_ROW_DEPTH and _depth(value) > MAX_ROW_DEPTH:
        return _TOO_DEEP
    return None


def _parse_json(text: str) -> tuple[object, str | None]:
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg})"
    except RecursionError:
        return None, _TOO_DEEP


def _json_lines_rows(path: Path, source: str) -> list[int]:
    """The line of every object in a JSON-lines file; every bad line is named."""
    rows: list[int] = []
    problems = RowProblems(source)
    empty = 0
    for number, raw, size in bounded_lines(path):
        text, problem = decode_line(raw, size)
        if problem:
            problems.add(problem, number)
            continue
        if not text.strip():
            continue
        value, problem = _parse_json(text)
        problem = problem or json_row_problem(value, raw.count(b"[") + raw.count(b"{"))
        if problem:
            problems.add(problem, number)
            continue
        rows.append(number)
        empty += not value
    problems.raise_any(len(rows) + len(problems.found), "Fix or remove those lines (one JSON object per line).")
    if rows and empty == len(rows):  # datasets would find no columns and say so in its own words
        raise DataError(f"data.source: {source}: the file holds no samples: every line is an empty object {{}}.")
    return rows


def _json_array_rows(path: Path, source: str) -> list[int]:
    """The line where every object of a JSON array file starts; the first bad element is named."""
    try:
        raw = read_limited(path, MAX_JSON_ARRAY_BYTES, pipes=False)
    except TooLarge:
        raise DataError(f"data.source: {source}: a JSON array of more than {MAX_JSON_ARRAY_BYTES} bytes is read "
                        "whole; write the samples as JSON lines (.jsonl, one object per line) instead.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"data.source: {source}:{line}: {_not_utf8(raw, exc)}.") from None
    decoder, rows, problems = json.JSONDecoder(), [], RowProblems(source)
    position, line, counted = text.index("[") + 1, 1, 0

    def skip_space(at: int) -> int:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        return at

    while True:
        position = skip_space(position)
        line += text.count("\n", counted, position)
        counted = position
        if position >= len(text) or text[position] == "]":
            if position >= len(text):
                problems.add("not valid JSON (the array is not closed with ])", line)
            break
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            problems.add(f"not valid JSON ({exc.msg})", exc.lineno)
            break  # the elements after a broken one cannot be told apart
        except RecursionError:
            problems.add(_TOO_DEEP, line)
            break
        size = len(text[position:end].encode())
        problem = json_row_problem(value, text.count("[", position, end) + text.count("{", position, end))
        if problem or size > MAX_ROW_BYTES:
            problems.add(problem or too_large(size), line)
            break
        rows.append(line)
        position = skip_space(end)
        if position < len(text) and text[position] == ",":
            position += 1
        elif position < len(text) and text[position] != "]":
            line += text.count("\n", counted, position)
            problems.add("not valid JSON (expected ',' or ']' after a sample)", line)
            break
    problems.raise_any(len(rows) + len(problems.found), "Fix it (a JSON array of objects, one per sample).")
    return rows


def _json_rows(path: Path, source: str) -> list[int]:
    """A JSON array file or a JSON-lines file, told apart by the first character that is not white space."""
    with open_input(path, pipes=False) as stream:
        start = stream.read(4096).lstrip()
    return _json_array_rows(path, source) if start.startswith(b"[") else _json_lines_rows(path, source)


def _csv_rows(path: Path, source: str) -> list[int]:
    """The line where every record of a CSV file starts; records with the wrong field count are named."""
    problems = RowProblems(source)
    consumed = [0]  # bytes of the file the csv reader has been given

    def decoded() -> Iterator[str]:
        for number, raw, size in bounded_lines(path):
            consumed[0] += size
            text, problem = decode_line(raw, size)
            if problem:
                problems.add(problem, number)
            yield "\n" if text is None else text + "\n"  # a line that cannot be read leaves a blank: numbers stay right

    csv.field_size_limit(max(csv.field_size_limit(), MAX_ROW_BYTES))
    reader = csv.reader(decoded())
    rows: list[int] = []
    header: list[str] | None = None
    ended, ended_bytes = 0, 0  # the line and byte where the previous record ended
    try:
        for record in reader:
            start, size = ended + 1, consumed[0] - ended_bytes
            ended, ended_bytes = reader.line_num, consumed[0]
            if not record:  # a blank line: not a record (datasets skips it too)
                continue
            if size > MAX_ROW_BYTES:
                problems.add(too_large(size), start)
            elif header is None:
                header = record
            elif len(record) != len(header):
                fields = "field" if len(record) == 1 else "fields"
                problems.add(f"{len(record)} {fields} where the header has {len(header)}; quote values that hold "
                             "commas", start)
            else:
                rows.append(start)
    except csv.Error as exc:
        problems.add(f"not valid CSV ({exc})", reader.line_num)
    problems.raise_any(len(rows) + len(problems.found), "Fix or remove those lines.")
    return rows


def file_rows(path: Path, loader: str, source: str) -> list[int] | None:
    """The file line of every row of a local JSON, JSON-lines or CSV file, after checking every row (None for
    formats without lines); raises DataError naming the file and line of what cannot be read."""
    try:
        if loader == "json":
            return _json_rows(path, source)
        if loader == "csv":
            return _csv_rows(path, source)
    except NotARegularFile as exc:
        raise DataError(f"data.source: {source}: not a regular file ({exc.kind}); save the data to a file.") from None
    return None


def load_split(source: str, split: str, scan: bool = True) -> Samples:
    """The named split of a data source, after checking every row of a local file (unless ``scan`` is False: the
    same file passed the checks before)."""
    import datasets

    loader, argument = resolve_source(source)
    try:
        if loader == "hub":
            return Samples(datasets.load_dataset(argument, split=split), source)
        lines = file_rows(Path(argument), loader, source) if scan else None
        if lines == []:
            raise DataError(f"data.source: {source}: the file holds no samples.")
        return Samples(datasets.load_dataset(loader, data_files={split: argument}, split=split), source, lines)
    except (FileNotFoundError, ConnectionError, ValueError) as exc:
        if loader == "hub":
            raise DataError(
                f"data.source: cannot load dataset {source!r} (split {split!r}): {exc}. Offline, only datasets already "
                "in the local cache load; otherwise point data.source at a local .jsonl/.csv/.parquet file."
            ) from None
        raise DataError(f"data.source: {source}: {exc}") from None
    except datasets.exceptions.DatasetGenerationError as exc:  # what the checks above did not foresee
        cause = exc.__cause__ or exc
        raise DataError(f"data.source: {source}: datasets cannot read it: {type(cause).__name__}: "
                        f"{' '.join(str(cause).split())[:300]}") from None
