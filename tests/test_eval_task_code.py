"""Task files that name Python code (``!function``) run only when asked: ``tuner eval --include-path`` names every
such file and line and refuses without ``--allow-task-code``; and what lm-eval raises while scoring is one
message, not its traceback."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.cli import main
from tuner.evaluate.tasks import task_code

ROWS = '{"prompt": "abc", "answer": "cba"}\n{"prompt": "xy", "answer": "yx"}\n'


def task_folder(folder: Path, text_field: str = '"{{prompt}}"', generation: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text(ROWS)
    (folder / "helpers.py").write_text("import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('ran')\n\n"
                                       "def text(doc):\n    return doc['prompt']\n")
    (folder / "rev.yaml").write_text(
        f"task: rev_words\ndataset_path: json\ndataset_kwargs:\n  data_files: {{test: {folder / 'rows.jsonl'}}}\n"
        f"test_split: test\noutput_type: generate_until\ndoc_to_text: {text_field}\ndoc_to_target: \"{{{{answer}}}}\"\n"
        f"{generation}metric_list:\n  - metric: exact_match\n    higher_is_better: true\n")
    return folder


def test_a_task_naming_python_code_is_refused_naming_it(tmp_path, demo_model_path, capsys) -> None:
    tasks = task_folder(tmp_path / "tasks", "!function helpers.text")
    code = main(["eval", "--model", str(demo_model_path), "--no-held-out", "--tasks", "rev_words",
                 "--include-path", str(tasks)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: --include-path {tasks}: task files name Python code, which lm-evaluation-harness "
                          "imports and runs")
    assert f"{(tasks / 'rev.yaml').resolve()}:7: !function helpers.text" in err and "--allow-task-code" in err
    assert not (tasks / "RAN").exists()


@pytest.mark.slow
def test_allowed_task_code_is_announced_before_it_runs(tmp_path, demo_model_path, tuner_cli) -> None:
    tasks = task_folder(tmp_path / "tasks", "!function helpers.text",
                        "generation_kwargs:\n  max_gen_toks: 4\n  until: [\"\\n\"]\n")
    result = tuner_cli("eval", "--model", str(demo_model_path), "--no-held-out", "--tasks", "rev_words",
                       "--include-path", str(tasks), "--allow-task-code")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "warning: --allow-task-code: lm-evaluation-harness will import and run the Python code" in result.stderr
    assert (tasks / "RAN").exists()


@pytest.mark.slow
def test_what_lm_eval_raises_while_scoring_is_one_message(tmp_path, demo_model_path, tuner_cli) -> None:
    """max_gen_toks equal to the model's length: lm-eval's assert, 12 frames deep, became a traceback."""
    length = json.loads((demo_model_path / "config.json").read_text())["max_position_embeddings"]
    tasks = task_folder(tmp_path / "tasks", generation=f"generation_kwargs:\n  max_gen_toks: {length}\n")
    result = tuner_cli("eval", "--model", str(demo_model_path), "--no-held-out", "--tasks", "rev_words",
                       "--include-path", str(tasks))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert ("error: --tasks: lm-evaluation-harness stopped while scoring rev_words: AssertionError: Invalid "
            f"configuration: requested max tokens to generate ({length}) must be less than model's maximum sequence "
            f"length ({length}). Check the task's settings") in result.stderr


PLACES = ["top", "nested", "list", "tag directive", "included outside", "yml"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(places=st.lists(st.sampled_from(PLACES), max_size=4), decoys=st.integers(0, 3))
def test_every_function_tag_is_found_wherever_it_is_written(tmp_path_factory, places, decoys) -> None:
    """Tags at the top, in nested maps and lists, spelled through a %TAG directive, in a .yml file, or in a file
    outside the folder that a task includes (../): each one named; the words in strings and comments are not tags."""
    root = tmp_path_factory.mktemp("tasks")
    folder = root / "mine"
    folder.mkdir()
    lines = ["task: t", f"note: {json.dumps('!function in a string')}", "# doc_to_text: !function in.comment"][:1 + decoys]
    planted = 0
    extra_docs: dict[str, str] = {}
    for index, place in enumerate(places):
        if place == "top":
            lines.append(f"f{index}: !function m.top{index}")
        elif place == "nested":
            lines.append(f"n{index}:\n  inner:\n    fn: !function m.nested{index}")
        elif place == "list":
            lines.append(f"l{index}:\n  - plain\n  - !function m.listed{index}")
        elif place == "yml":
            extra_docs[f"other{index}.yml"] = f"task: o{index}\nfn: !function m.yml{index}\n"
        elif place == "tag directive":
            extra_docs[f"directive{index}.yaml"] = f"%TAG !e! !\n---\ntask: d{index}\nfn: !e!function m.dir{index}\n"
        else:
            (root / f"shared{index}.yaml").write_text(f"process_docs: !function m.shared{index}\n")
            lines.append(f"include: ../shared{index}.yaml")
        planted += 1
    includes = [line for line in lines if line.startswith("include:")]
    lines = [line for line in lines if not line.startswith("include:")]
    if includes:
        lines.append("include:\n" + "".join(f"  - {line.split(': ', 1)[1]}\n" for line in includes).rstrip())
    (folder / "main.yaml").write_text("\n".join(lines) + "\n")
    for name, text in extra_docs.items():
        (folder / name).write_text(text)
    found = task_code(folder)
    assert len(found) == planted, found
    assert all(": !function m." in entry for entry in found)
