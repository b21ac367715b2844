"""Every data check, through the one entry point `tuner run` calls before it writes or launches anything
(:func:`tuner.data.prepare.check_data`) and through `tuner data preview`: a DataError naming the file and
the line, never a traceback, whatever the file holds (wrong CSV shape, invalid UTF-8, deep nesting,
a row of 100 MB, an unknown chat role)."""
from __future__ import annotations

import json
import re

import pytest

from tuner.cli import main
from tuner.data.prepare import check_data
from tuner.data.sources import MAX_ROW_BYTES, DataError
from tuner.recipe.io import validate_recipe


def recipe_for(path, **data):
    return validate_recipe({
        "model": {"id": "builtin:demo", "dtype": "float32"},
        "memory": {"mixed_precision": "no", "max_seq_length": 64},
        "data": {"source": str(path), "eval_fraction": 0, **data},
    })


def refused(path, fragment: str, capsys, **data) -> str:
    """check_data and `tuner data preview` both refuse ``path`` with a message naming it and ``fragment``."""
    with pytest.raises(DataError) as caught:
        check_data(recipe_for(path, **data))
    message = str(caught.value)
    assert message.startswith(f"data.source: {path}"), message
    assert re.search(fragment, message), message
    sets = [f"data.source={path}", "data.eval_fraction=0", *(f"data.{key}={value}" for key, value in data.items())]
    code = main(["data", "preview", "demo", *[arg for s in sets for arg in ("--set", s)],
                 *([] if "format" in data else ["--set", "data.format=auto"])])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert f"error: data.source: {path}" in err and re.search(fragment, err), err
    return message


CASES = {
    # name: (file name, bytes, fragment of the message)
    "csv with too many fields": ("bad.csv", b'text\nhello\n"a",b\nworld\n',
                                 r"bad\.csv:3: 2 fields where the header has 1"),
    "csv with too few fields": ("few.csv", b"instruction,output\na,b\nc\n", r"few\.csv:3: 1 field where the header has 2"),
    "csv not utf-8": ("latin.csv", b"text\nok\ncaf\xe9\n", r"latin\.csv:3: not UTF-8 \(byte 0xe9\)"),
    "jsonl not utf-8": ("latin.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n', r"latin\.jsonl:2: not UTF-8 \(byte 0xe9\)"),
    "jsonl nested 100k deep": ("deep.jsonl", b'{"text": "ok"}\n{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
                               r"deep\.jsonl:2: nested too deeply"),
    "json array nested 100k deep": ("deep.json", b'[{"text": "ok"},\n{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]",
                                    r"deep\.json:2: nested too deeply"),
    "jsonl nested 40 deep": ("nest.jsonl", b'{"text": "ok", "x": ' + b"[" * 40 + b"]" * 40 + b"}\n",
                             r"nest\.jsonl:1: nested too deeply"),
    # pyarrow 26's JSON reader (what datasets reads JSON lines with) dies with SIGSEGV on a file of only null rows:
    # the line scan must refuse it before datasets sees it
    "jsonl of null rows": ("nulls.jsonl", b"null\n\nnull\n", r"nulls\.jsonl:1: a JSON null, not an object.*line 3"),
    "json array with a broken row": ("broken.json", b'[\n{"text": "a"},\n{"text": b}\n]\n', r"broken\.json:3: not valid JSON"),
    "json array of lists": ("lists.json", b'[\n{"text": "a"},\n[1]\n]\n', r"lists\.json:3: a JSON list, not an object"),
    "chat role wizard": ("wizard.jsonl", json.dumps({"messages": [{"role": "wizard", "content": "hi"},
                                                                  {"role": "assistant", "content": "yo"}]}).encode(),
                         r"wizard\.jsonl:1: role 'wizard' is not one of system, user, assistant, tool"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_data_is_refused_naming_file_and_line(name, tmp_path, capsys) -> None:
    file_name, body, fragment = CASES[name]
    path = tmp_path / file_name
    path.write_bytes(body)
    refused(path, fragment, capsys)


def test_a_100_mb_row_is_refused_with_its_line_before_anything_reads_it_whole(tmp_path, capsys) -> None:
    import resource

    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as stream:
        stream.write(b'{"text": "ok"}\n{"text": "')
        chunk = b"x" * 2**20
        for _ in range(100):
            stream.write(chunk)
        stream.write(b'"}\n{"text": "fine"}\n')
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    size = len(b'{"text": "') + 100 * 2**20 + len(b'"}')
    message = refused(path, rf"huge\.jsonl:2: the row is {size} bytes; a row may hold {MAX_ROW_BYTES} bytes", capsys)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200, f"checking grew the process by {grown_mib:.0f} MiB"
    assert "line 3" not in message


def test_a_huge_row_in_a_parquet_file_is_refused_with_its_row(tmp_path, capsys, monkeypatch) -> None:
    import datasets

    import tuner.data.sources

    monkeypatch.setattr(tuner.data.sources, "MAX_ROW_BYTES", 1000)
    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list([{"text": "ok"}, {"text": "x" * 5000}, {"text": "fine"}]).to_parquet(str(path))
    with pytest.raises(DataError, match=r"rows\.parquet: row 2: the row is 5000 bytes; a row may hold 1000 bytes"):
        check_data(recipe_for(path))


def test_not_a_regular_file_is_refused(tmp_path, capsys) -> None:
    import os

    fifo = tmp_path / "stream.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=r"stream\.jsonl: not a regular file \(a pipe\)"):
        check_data(recipe_for(fifo))
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    with pytest.raises(DataError, match=r"folder\.jsonl: not a regular file \(a directory\)"):
        check_data(recipe_for(folder))


def test_good_data_gives_its_counts(tmp_path) -> None:
    path = tmp_path / "good.csv"
    path.write_text('instruction,output\n"multi\nline",b\nc,d\n\ne,f\n')
    summary = check_data(recipe_for(path, eval_fraction=0.34))
    assert (summary.train, summary.held_out, summary.data_format) == (2, 1, "instruction")


def test_prompt_files_for_infer_are_read_line_by_line_with_the_same_limits(tmp_path, monkeypatch) -> None:
    import tuner.data.sources
    from tuner.infer.batch import read_prompt_file

    monkeypatch.setattr(tuner.data.sources, "MAX_ROW_BYTES", 20_000)
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n{"prompt": "' + b"x" * 30_000 + b'"}\n'
                     + b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}\n"
                     + json.dumps({"messages": [{"role": "wizard", "content": "hi"}, {"role": "user", "content": "q"}]}).encode()
                     + b"\n")
    good, bad = read_prompt_file(path)
    assert [p.line for p in good] == [1]
    reasons = {b.line: b.reason for b in bad}
    assert reasons[2].startswith("not UTF-8 (byte 0xe9)")
    assert reasons[3].startswith("the row is 30014 bytes; a row may hold 20000 bytes")
    assert reasons[4].startswith("nested too deeply")
    assert reasons[5] == "role 'wizard' is not one of system, user, assistant, tool."


def test_rows_checked_column_by_column_are_accepted_or_named_by_their_line(tmp_path) -> None:
    """The row checks run on Arrow columns: good text, instruction and chat rows pass (a null input, an empty tool
    message), and a refused row is named by its file line (blank lines counted)."""
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    good = {"text.jsonl": [{"text": "a"}, {"text": "b"}],
            "instruction.jsonl": [{"instruction": "a", "input": None, "output": "b"}, {"instruction": "a", "output": "b"}],
            "chat.jsonl": [{"messages": chat}, {"messages": chat[:1] + [{"role": "tool", "content": ""}]}]}
    for name, rows in good.items():
        (tmp_path / name).write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
        check_data(recipe_for(tmp_path / name))
    (tmp_path / "good.csv").write_text("text\na\n\nb\n")
    check_data(recipe_for(tmp_path / "good.csv"))

    bad = {"text.jsonl": ([{"text": "a"}, {"text": ""}], r"text\.jsonl:3: 'text' is missing or empty"),
           "instruction.jsonl": ([{"instruction": "a", "output": "b"}, {"instruction": "a", "input": 3, "output": "b"}],
                                 r"instruction\.jsonl:3: 'input' is not a string"),
           "chat.jsonl": ([{"messages": chat}, {"messages": chat}, {"messages": [{"role": "user"}]}],
                          r"chat\.jsonl:4: a message lacks a 'role' or a string 'content'"),
           "empty.jsonl": ([{"messages": chat}, {"messages": []}], r"empty\.jsonl:3: 'messages' is missing or not a list")}
    for name, (rows, fragment) in bad.items():
        path = tmp_path / "bad" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(rows[0]) + "\n\n" + "\n".join(json.dumps(row) for row in rows[1:]) + "\n")
        with pytest.raises(DataError, match=fragment):
            check_data(recipe_for(path))
