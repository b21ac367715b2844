"""Chat keeps its history through the chat template, streams, and the CLI handles /reset and end of input."""
from __future__ import annotations

import re

import pytest

from tuner.infer.chat import ChatSession
from tuner.infer.generate import Sampling

pytestmark = pytest.mark.slow  # loads the demo model and generates


@pytest.fixture(scope="module")
def demo(demo_model_path):
    from tuner.infer.load import load_for_inference
    from tuner.infer.target import resolve_target

    target = resolve_target(model=str(demo_model_path), overrides=["model.dtype=float32"])
    return load_for_inference(target, context=64, max_memory={"cpu": "1GiB"})


GREEDY = Sampling(max_new_tokens=6, greedy=True, temperature=1.0, top_p=1.0)


def char_ids(tokenizer, text: str) -> list[int]:
    """The demo tokenizer has one token per character."""
    vocab = tokenizer.get_vocab()
    return [vocab[c] for c in text]


def test_two_turn_conversation_token_ids(demo):
    tokenizer = demo.tokenizer
    session = ChatSession(demo.model, tokenizer, GREEDY)
    assert session.prompt_ids("reverse\nabc") == char_ids(tokenizer, "reverse\nabc=")
    streamed = "".join(session.send("reverse\nabc"))
    reply = session.history[-1]["content"]
    assert streamed == reply
    assert session.history == [{"role": "user", "content": "reverse\nabc"}, {"role": "assistant", "content": reply}]
    # the demo template: user turns end with '=', assistant turns with </s>
    expected = (char_ids(tokenizer, "reverse\nabc=") + char_ids(tokenizer, reply) + [tokenizer.eos_token_id]
                + char_ids(tokenizer, "reverse\nxyz="))
    assert session.prompt_ids("reverse\nxyz") == expected
    list(session.send("reverse\nxyz"))
    assert [m["role"] for m in session.history] == ["user", "assistant", "user", "assistant"]
    session.reset()
    assert session.history == []


def test_streamed_answer_is_the_batch_answer(demo):
    from tuner.infer.generate import generate_answers, render_prompt

    session = ChatSession(demo.model, demo.tokenizer, GREEDY)
    chunks = list(session.send("reverse\nhello"))
    prompt = render_prompt(demo.tokenizer, [{"role": "user", "content": "reverse\nhello"}])
    assert "".join(chunks) == generate_answers(demo.model, demo.tokenizer, [prompt], max_new_tokens=6)[0]


def test_closing_the_stream_cancels_the_turn(demo):
    session = ChatSession(demo.model, demo.tokenizer, Sampling(200, True, 1.0, 1.0), system="be brief")
    stream = session.send("reverse\nabc")
    assert next(stream)
    stream.close()  # the user cancelled after the first chunk
    assert session.history == [{"role": "system", "content": "be brief"}]


def test_chat_cli_reset_and_end_of_input(demo_model_path, tuner_cli):
    # a trailing backslash continues the message on the next line
    script = "reverse\\\nabc\n/reset\nreverse\\\nabc\n"
    result = tuner_cli("chat", "--model", str(demo_model_path), "--greedy", "--max-new-tokens", "5", input=script)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == second  # after /reset the same question gets the same greedy answer
    assert len(re.findall(r"^\(\d+ tokens in \d+\.\d\d s: \d+\.\d tokens/s\)$", result.stderr, re.MULTILINE)) == 2
    assert "(conversation cleared)" in result.stderr
    assert tuner_cli("chat", "--model", str(demo_model_path), input="/exit\nnever read\n").returncode == 0


def test_an_instruction_prompt_without_a_chat_template_is_rendered_as_training_renders_it(demo):
    """Alpaca's layout: the first line is the instruction, the rest its input, as in the training sample."""
    import copy

    from tuner.data.formats import prompt_text
    from tuner.infer.generate import render_prompt, user_turn

    tokenizer = copy.deepcopy(demo.tokenizer)
    tokenizer.chat_template = None
    sample = {"instruction": "reverse", "input": "abc", "output": "cba"}
    turn = [{"role": "user", "content": user_turn("abc", "reverse")}]
    assert render_prompt(tokenizer, turn, "instruction") == prompt_text(sample, "instruction", tokenizer)
    alone = [{"role": "user", "content": "write a poem"}]
    assert render_prompt(tokenizer, alone, "instruction") == prompt_text(
        {"instruction": "write a poem", "output": "-"}, "instruction", tokenizer)
