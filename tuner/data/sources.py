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
from itertools import count, islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

from tuner.data.reverse import BUILTIN_DATASETS, builtin_dataset_path
from tuner.fileio import NotARegularFile, TooLarge, json_kind, open_input, read_limited, special_kind, user_path
from tuner.home import tuner_home
from tuner.reason import library_words

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
    path = user_path(source)
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


def listed(places: list[str], total: int | None = None) -> str:
    """'line 3, line 9, ... (and 12 more)': the first few of ``total`` places of a problem (all of them by default)."""
    total = len(places) if total is None else total
    more = f" (and {total - MAX_LISTED} more)" if total > MAX_LISTED else ""
    return ", ".join(places[:MAX_LISTED]) + more


@dataclass
class RowProblems:
    """What is wrong with which rows of one source; raised as one DataError naming the first at its file line.

    Holds only the first few problems and a count, however many rows are refused; dataset rows are named by their
    file lines only when raised (``lines`` maps row indices to lines, reading the file again)."""

    source: str
    lines: Callable[[Iterable[int]], dict[int, int]] | None = None  # dataset rows -> file lines, when the file has lines
    found: list[tuple[int, str, str]] = field(default_factory=list)  # (order, place, reason): the first few
    count: int = 0  # problems found in all

    def _note(self, order: int, place: str, reason: str) -> None:
        self.count += 1
        self.found.append((order, place, reason))
        if len(self.found) > 4 * MAX_LISTED:  # only the first MAX_LISTED + 1 are ever named
            self.found = sorted(self.found)[:MAX_LISTED + 1]

    def add(self, reason: str, line: int) -> None:
        """A problem at a line of the file."""
        self._note(line, f"line {line}", reason)

    def add_row(self, index: int, reason: str) -> None:
        """A problem of the dataset's row ``index`` (from 0), named by its file line (when the file has lines)."""
        self._note(index + 1, f"row {index + 1}", reason)

    def raise_any(self, total: int, fix: str) -> None:
        if not self.found:
            return
        found = sorted(self.found)[:MAX_LISTED + 1]
        rows = [order - 1 for order, place, _ in found if place.startswith("row ")]
        if rows and self.lines:
            lines = self.lines(rows)
            found = [(lines[order - 1], f"line {lines[order - 1]}", reason) if place.startswith("row ")
                     else (order, place, reason) for order, place, reason in found]
        _, place, reason = found[0]
        where = f"{self.source}:{place.removeprefix('line ')}" if place.startswith("line ") else f"{self.source}: {place}"
        more = ""
        if self.count > 1:
            more = (f"; {self.count - 1} more of {total} rows cannot be used: "
                    + listed([f"{p} ({r})" for _, p, r in found[1:]], self.count - 1))
        raise DataError(f"data.source: {where}: {reason}{more}. {fix}")


@dataclass
class Samples:
    """A loaded split: a datasets.Dataset, or a datasets.IterableDataset when streamed; for a local JSON or CSV
    file, the file (its rows are named by their lines) and the number of rows its scan counted."""

    dataset: object
    source: str
    file: tuple[Path, str] | None = None  # (path, loader) of a local JSON or CSV file
    rows: int | None = None  # counted by the scan of a local JSON or CSV file

    def problems(self) -> RowProblems:
        return RowProblems(self.source, self.lines_of if self.file else None)

    def lines_of(self, indices: Iterable[int]) -> dict[int, int]:
        """The file line where each of the dataset rows ``indices`` (from 0) starts: the file is scanned again,
        only as far as the last of them (only refused rows are named, so a clean file is scanned once)."""
        wanted = set(indices)
        path, loader = self.file
        starts = islice(enumerate(row_lines(path, loader, self.source)), max(wanted) + 1)
        return {index: line for index, line in starts if index in wanted}


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


_TOO_DEEP = f"nested too deeply (more than {MAX_ROW_DEPTH} levels); a sample is an object of text fields"


def json_row_problem(value, brackets: int) -> str | None:
    """Why a parsed JSON row is not a sample object, or None; ``brackets`` (the [ and { in its text) bounds its depth."""
    if not isinstance(value, dict):
        return f"{json_kind(value)}, not an object"
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


def _json_lines_rows(path: Path, source: str, until: int | None = None) -> Iterator[int]:
    """The line of every object in a JSON-lines file (up to line ``until``), in one pass; every bad line is named at
    the end."""
    rows = 0
    problems = RowProblems(source)
    empty = 0
    for number, raw, size in bounded_lines(path):
        if until is not None and number > until:
            break
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
        yield number
        rows += 1
        empty += not value
    problems.raise_any(rows + problems.count, "Fix or remove those lines (one JSON object per line).")
    if rows and empty == rows:  # datasets would find no columns and say so in its own words
        raise DataError(f"data.source: {source}: the file holds no samples: every line is an empty object {{}}.")


def _json_array_rows(path: Path, source: str, until: int | None = None) -> Iterator[int]:
    """The line where every object of a JSON array file starts (the file is read whole, up to MAX_JSON_ARRAY_BYTES:
    ``until`` does not shorten it); the first bad element is named at the end."""
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
    decoder, rows, problems = json.JSONDecoder(), 0, RowProblems(source)
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
        yield line
        rows += 1
        position = skip_space(end)
        if position < len(text) and text[position] == ",":
            position += 1
        elif position < len(text) and text[position] != "]":
            line += text.count("\n", counted, position)
            problems.add("not valid JSON (expected ',' or ']' after a sample)", line)
            break
    problems.raise_any(rows + problems.count, "Fix it (a JSON array of objects, one per sample).")


def _json_rows(path: Path, source: str, until: int | None = None) -> Iterator[int]:
    """A JSON array file or a JSON-lines file, told apart by the first character that is not white space."""
    with open_input(path, pipes=False) as stream:
        start = stream.read(4096).lstrip()
    yield from (_json_array_rows if start.startswith(b"[") else _json_lines_rows)(path, source, until)


def _csv_rows(path: Path, source: str, until: int | None = None) -> Iterator[int]:
    """The line where every record of a CSV file starts (up to the record that ends at or after line ``until``), in
    one pass; records with the wrong field count are named at the end."""
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
    rows = 0
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
                yield start
                rows += 1
            if until is not None and ended >= until:
                break
    except csv.Error as exc:
        problems.add(f"not valid CSV ({exc})", reader.line_num)
    problems.raise_any(rows + problems.count, "Fix or remove those lines.")


LINED_LOADERS = {"json": _json_rows, "csv": _csv_rows}  # the loaders whose rows have file lines, and their scans


FIRST_LINES_SCANNED = 1000  # of a stream read without the whole-file scan (preview, inference, the ranks)


def row_lines(path: Path, loader: str, source: str, until: int | None = None) -> Iterator[int]:
    """The file line where each row of a local JSON, JSON-lines or CSV file starts, in one pass holding one row at a
    time (up to line ``until``); every row is checked, and what cannot be read raises DataError naming the file and
    line at the end."""
    try:
        yield from LINED_LOADERS[loader](path, source, until)
    except NotARegularFile as exc:
        raise DataError(f"data.source: {source}: not a regular file ({exc.kind}); save the data to a file.") from None


def load_split(source: str, split: str, streaming: bool = False, scan: bool = True) -> Samples:
    """The named split of a data source, after checking every row of a local JSON or CSV file unless ``scan`` is
    false.  Streamed, a local file is read as the dataset is iterated, a hub dataset from its Arrow files in the
    datasets cache; a stream not scanned whole still has its first FIRST_LINES_SCANNED lines scanned, for what
    reads its first rows: pyarrow's JSON reader dies (SIGSEGV) on a file whose first row is null."""
    import datasets

    loader, argument = resolve_source(source)
    try:
        if loader == "hub":
            dataset = datasets.load_dataset(argument, split=split)
            return Samples(dataset.to_iterable_dataset() if streaming else dataset, source)
        file = (Path(argument), loader) if loader in LINED_LOADERS else None
        rows = None
        if file and scan:
            rows = sum(1 for _ in row_lines(*file, source))
        elif file and streaming:  # its first lines: what preview, inference and each rank read first
            for _ in row_lines(*file, source, until=FIRST_LINES_SCANNED):
                pass
        if rows == 0:
            raise DataError(f"data.source: {source}: the file holds no samples.")
        dataset = datasets.load_dataset(loader, data_files={split: argument}, split=split, streaming=streaming)
        return Samples(dataset, source, file, rows)
    except (FileNotFoundError, ConnectionError, ValueError) as exc:
        if loader == "hub":
            raise DataError(
                f"data.source: cannot load dataset {source!r} (split {split!r}): {exc}. Offline, only datasets already "
                "in the local cache load; otherwise point data.source at a local .jsonl/.csv/.parquet file."
            ) from None
        raise DataError(f"data.source: {source}: {library_words(exc, 1000)}") from None
    except datasets.exceptions.DatasetGenerationError as exc:  # what the checks above did not foresee
        cause = exc.__cause__ or exc
        raise DataError(f"data.source: {source}: datasets cannot read it: {type(cause).__name__}: "
                        f"{library_words(cause)}") from None
