"""``tuner infer`` as a user runs it: one prompt, a JSONL batch with malformed lines, a trained run directory."""
from __future__ import annotations

import json
import re

import pytest
from conftest import library_noise

from tuner.data.reverse import BUILTIN_DATASETS, reverse_samples

pytestmark = pytest.mark.slow  # loads the demo model and generates

GREEDY = ["--greedy", "--max-new-tokens", "4"]  # on a CPU the demo loads in float32 without --set model.dtype


def test_batch_keeps_order_and_reports_malformed_lines(tmp_path, demo_model_path, tuner_cli):
    from tuner.infer.generate import generate_answers, render_prompt
    from tuner.infer.load import load_for_inference
    from tuner.infer.target import resolve_target

    lines = [
        json.dumps({"id": "a", "prompt": "reverse\nabc"}),
        "{not json",
        "",
        json.dumps({"id": "b", "messages": [{"role": "user", "content": "reverse\nhello"}]}),
        json.dumps(["a list"]),
        json.dumps({"id": "c", "messages": [{"role": "assistant", "content": "no user turn"}]}),
        json.dumps({"id": "d", "prompt": "reverse\nxy"}),
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    answers = tmp_path / "answers.jsonl"
    result = tuner_cli("infer", "--model", str(demo_model_path), "--input", str(prompts), "--output", str(answers),
                       *GREEDY)
    assert result.returncode == 2, result.stderr
    for line in (2, 5, 6):
        assert f"{prompts}:{line}:" in result.stderr
    assert "wrote 3 answer(s)" in result.stderr and "3 line(s) not answered" in result.stderr
    assert "Model placement" in result.stderr

    records = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 4, 5, 6, 7]  # one per non-blank input line, in order
    assert [r.get("id") for r in records] == ["a", None, "b", None, None, "d"]
    assert all("error" in records[i] for i in (1, 3, 4))
    # each answer is the model's answer to its own prompt
    loaded = load_for_inference(resolve_target(model=str(demo_model_path), overrides=["model.dtype=float32"]),
                                context=32, max_memory={"cpu": "1GiB"})
    texts = [render_prompt(loaded.tokenizer, [{"role": "user", "content": c}])
             for c in ("reverse\nabc", "reverse\nhello", "reverse\nxy")]
    expected = generate_answers(loaded.model, loaded.tokenizer, texts, max_new_tokens=4)
    assert [records[i]["answer"] for i in (0, 2, 5)] == expected

    one = tuner_cli("infer", "--model", str(demo_model_path), "--prompt", "reverse\nabc", *GREEDY)
    assert one.returncode == 0, one.stderr
    assert one.stdout == expected[0] + "\n"  # stdout holds only the answer; the placement goes to stderr
    assert re.search(r"^\d+ tokens in \d+\.\d\d s: \d+\.\d tokens/s$", one.stderr, re.MULTILINE), one.stderr

    again = tuner_cli("infer", "--model", str(demo_model_path), "--input", str(prompts), "--output", str(answers))
    assert again.returncode == 2 and "--force" in again.stderr


def test_prompt_and_flags_are_checked(tmp_path, demo_model_path, tuner_cli):
    result = tuner_cli("infer", "--model", str(demo_model_path))
    assert result.returncode == 2 and "--prompt" in result.stderr
    result = tuner_cli("infer", str(tmp_path), "--prompt", "x")
    assert result.returncode == 2 and "error:" in result.stderr


@pytest.mark.xdist_group("trained-demo")
def test_trained_run_directory_answers_its_task(tmp_path, tuner_cli, trained_demo):
    """The demo run, fully fine-tuned, reverses words that the untrained model cannot."""
    run_dir = trained_demo
    words = ["abc", "dog", "cat", "sun", "map", "pen"]
    prompts = tmp_path / "words.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"reverse\n{w}"}) + "\n" for w in words))

    def correct(*target: str) -> int:
        out = tmp_path / f"answers-{len(target)}.jsonl"
        result = tuner_cli("infer", *target, "--input", str(prompts), "--output", str(out), "--force",
                           "--greedy", "--max-new-tokens", "5")
        assert result.returncode == 0, result.stderr
        assert not library_noise(result.stdout + result.stderr), result.stderr  # in the run's log (or tuner's)
        answers = [json.loads(line)["answer"] for line in out.read_text().splitlines()]
        return sum(answer == word[::-1] for answer, word in zip(answers, words))

    assert correct(str(run_dir)) >= 4
    assert correct("demo") == 0  # the same recipe before training (builtin:demo)

    # asked as it was trained: a bare word is the input of the run's one instruction ('reverse'),
    # in chat (greedy by default for the demo) as in infer
    trained_words = {sample["input"] for sample in reverse_samples(BUILTIN_DATASETS["builtin:reverse"])}
    unseen = [word for word in ("dog", "cat", "sun", "map", "pen", "cup", "hat", "box", "red", "sky")
              if word not in trained_words][:6]
    logged = (run_dir / "train.log").stat().st_size
    chat = tuner_cli("chat", str(run_dir), "--max-new-tokens", "5", input="".join(f"{w}\n" for w in unseen))
    assert chat.returncode == 0, chat.stderr
    assert not library_noise(chat.stdout + chat.stderr), chat.stderr
    with open(run_dir / "train.log", encoding="utf-8", errors="replace") as log:
        log.seek(logged)
        assert "Loading weights" in log.read()  # the loading bar went to the end of the run's log
    assert "prompt format: instruction 'reverse' with each message as its input" in chat.stderr
    answers = chat.stdout.splitlines()
    assert sum(answer.strip() == word[::-1] for answer, word in zip(answers, unseen)) >= 4, (unseen, answers)
    one = tuner_cli("infer", str(run_dir), "--prompt", unseen[0], "--max-new-tokens", "5", "--verbose")
    assert one.returncode == 0 and one.stdout.strip() == answers[0].strip()
    assert "Loading weights" in one.stderr  # --verbose: the libraries' own output here
