"""Prompts longer than the model's context are refused one at a time, naming the limit, and never cost the answers
of the others: ``tuner infer --input`` writes each answer as it comes, ``--prompt`` and ``tuner chat`` refuse the
long one and go on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow  # loads the demo model and generates

GREEDY = ["--greedy", "--max-new-tokens", "4"]
DEMO_CONTEXT = 256  # the built-in demo model's max_position_embeddings


def test_a_line_longer_than_the_context_is_refused_and_the_others_answered(tmp_path, demo_model_path, tuner_cli):
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"id": "a", "prompt": "reverse\nabc"}, {"id": "long", "prompt": "reverse\n" + "a" * 1_000_000},
             {"id": "b", "messages": [{"role": "user", "content": "reverse\n" + "b" * 300}]},
             {"id": "c", "prompt": "reverse\nxy"}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    answers = tmp_path / "answers.jsonl"
    result = tuner_cli("infer", "--model", str(demo_model_path), "--input", str(prompts), "--output", str(answers),
                       *GREEDY, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for line in (2, 3):
        assert f"{prompts}:{line}: the prompt is " in result.stderr, result.stderr
    assert f"the model's context of {DEMO_CONTEXT} tokens" in result.stderr
    records = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [record["line"] for record in records] == [1, 2, 3, 4]
    assert "answer" in records[0] and "answer" in records[3]
    assert "error" in records[1] and "error" in records[2] and "context" in records[1]["error"]


def test_a_prompt_longer_than_the_context_is_refused_naming_the_limit(demo_model_path, tuner_cli):
    result = tuner_cli("infer", "--model", str(demo_model_path), "--prompt", "x" * 100_000, *GREEDY, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert f"more than the model's context of {DEMO_CONTEXT} tokens" in result.stderr, result.stderr


def test_max_new_tokens_beyond_the_context_is_refused_before_generating(demo_model_path, tuner_cli):
    result = tuner_cli("infer", "--model", str(demo_model_path), "--prompt", "reverse\nabc", "--max-new-tokens",
                       "100000", timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"the model's context of {DEMO_CONTEXT} tokens" in result.stderr, result.stderr


def test_chat_refuses_a_message_longer_than_the_context_and_answers_the_next(demo_model_path, tuner_cli):
    result = tuner_cli("chat", "--model", str(demo_model_path), *GREEDY, input="y" * 1_000_000 + "\nreverse\nabc\n",
                       timeout=300)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "message 1: the prompt is " in result.stderr and "not sent" in result.stderr, result.stderr
    assert result.stdout.strip(), "the second message is answered"


def test_answers_are_written_as_they_come(tmp_path, demo_model_path):
    """A batch stopped half-way (killed) keeps the answers it had: the file fills line by line, in input order."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"reverse\n{'abc'[i % 3:]}x"}) + "\n" for i in range(3000)))
    answers = tmp_path / "answers.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "tuner", "infer", "--model", str(demo_model_path), "--input", str(prompts), "--output",
         str(answers), "--batch-size", "1", *GREEDY], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 300
        while not (answers.exists() and answers.read_text().count("\n") >= 2):
            assert process.poll() is None, f"ended before any answer was written: {process.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no answer written in 300 s"
            time.sleep(0.05)
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
    written = answers.read_text().splitlines()
    complete = [json.loads(line) for line in written[:-1]]  # the last line may be cut by the kill
    assert len(complete) >= 1 and [record["line"] for record in complete] == list(range(1, len(complete) + 1))
    assert all("answer" in record for record in complete)
