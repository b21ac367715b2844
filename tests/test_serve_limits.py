"""A hostile or careless client on 127.0.0.1 cannot take `tuner serve` from the others: every bad field is a 4xx
naming it (no traceback in the log), max_tokens and the prompt are capped by the model's context, a body is read up
to its limit, the server keeps answering a bounded load, and SIGTERM stops it within seconds.

One server (the built-in demo model, context 256 tokens) is shared by the tests of this module."""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO
from test_serve import free_port, wait_until_serving

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("serve-limits")]
TIMEOUT_S = 60  # each request's own timeout: a request never waits on the test longer
HELLO = [{"role": "user", "content": "reverse\nabc"}]


def request(port: int, path: str, body: bytes | dict | None = None, method: str = "POST") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    sent = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                  headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(sent, timeout=TIMEOUT_S) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        text = error.read()
        try:
            return error.code, json.loads(text)
        except ValueError:
            return error.code, {"raw": text.decode(errors="replace")}


def chat(port: int, **fields) -> tuple[int, dict]:
    return request(port, "/v1/chat/completions", {"messages": HELLO, "temperature": 0, **fields})


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_model_path):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with open(log, "w") as stream:
        process = subprocess.Popen([sys.executable, "-m", "tuner", "serve", "--model", str(demo_model_path), "--port",
                                    str(port), "--request-timeout", "5"], stdout=stream, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_until_serving(port, process, log.read_text)
    yield port, process, log
    if process.poll() is None:
        process.kill()
        process.wait()


HOSTILE = [  # (fields, status, what the message names)
    ({"max_tokens": 10**12}, 400, "max_tokens"),
    ({"max_tokens": 1e30}, 400, "max_tokens"),
    ({"max_tokens": -5}, 400, "max_tokens"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": "many"}, 400, "max_tokens"),
    ({"max_tokens": True}, 400, "max_tokens"),
    ({"max_completion_tokens": 300}, 400, "context of 256 tokens"),
    ({"max_tokens": 250, "messages": [{"role": "user", "content": "a" * 300}]}, 400, "context of 256 tokens"),
    ({"seed": 10**40}, 400, "seed"),
    ({"seed": -1}, 400, "seed"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"frequency_penalty": 1e308 * 10}, 400, "frequency_penalty"),
    ({"logit_bias": {"9" * 40: 1}}, 400, "logit_bias"),
    ({"logit_bias": {"5": "x"}}, 400, "logit_bias"),
    ({"logit_bias": [1, 2]}, 400, "logit_bias"),
    ({"stop": ["a"] * 50}, 400, "stop"),
    ({"stop": 5}, 400, "stop"),
    ({"messages": None}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0]"),
    ({"messages": [{"role": "user", "content": {"a": 1}}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x" * 1_000_000}]}, 400, "context of 256 tokens"),
    ({"generation_config": json.dumps({"max_new_tokens": 10**9})}, 400, "generation_config"),
    ({"stream": "yes"}, 400, "stream"),
    ({"model": ["a"]}, 400, "model"),
]


def test_hostile_fields_are_4xx_naming_the_field_and_the_server_answers_on(server):
    port, _, log = server
    for fields, status, named in HOSTILE:
        code, answer = chat(port, **fields)
        assert code == status and named in answer["error"]["message"], (fields, code, answer)
        code, answer = chat(port, max_tokens=3)
        assert code == 200 and answer["choices"][0]["message"]["content"] is not None, (fields, answer)
    assert "Traceback" not in log.read_text()


def test_bodies_too_large_not_json_or_not_served_are_refused(server):
    port, _, log = server
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    connection.putrequest("POST", "/v1/chat/completions")
    connection.putheader("Content-Length", str(10 * 1024 * 1024))  # refused before a byte of the body is read
    connection.endheaders()
    assert connection.getresponse().status == 413
    connection.close()
    chunked = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)  # no length declared: read up to it
    chunked.request("POST", "/v1/chat/completions", body=iter([b"x" * 65536] * 40), encode_chunked=True,
                    headers={"Transfer-Encoding": "chunked"})
    assert chunked.getresponse().status == 413
    chunked.close()
    assert request(port, "/v1/chat/completions", b"{not json")[0] == 400
    assert request(port, "/v1/chat/completions", b"[" * 100_000)[0] == 400
    assert request(port, "/v1/chat/completions", b"[1, 2]")[0] == 400
    assert request(port, "/load_model", {"model": "gpt2"})[0] == 404
    assert request(port, "/reset", {})[0] == 404
    assert request(port, "/health", method="GET")[0] == 200
    assert chat(port, max_tokens=3)[0] == 200
    assert "Traceback" not in log.read_text()


def test_a_request_without_max_tokens_is_capped_by_the_context(server):
    port, _, _ = server
    code, answer = chat(port, messages=[{"role": "user", "content": "b" * 200}])
    assert code == 200, answer
    usage = answer["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= 256


def test_a_bounded_load_is_answered(server):
    """120 requests from 8 clients at once, long and short answers, streamed and not, good and bad: each gets its
    answer within its own timeout, the bad ones a 4xx."""
    port, _, log = server

    def one(index: int) -> tuple[int, int]:
        if index % 5 == 4:
            return 400, chat(port, max_tokens=10**12)[0]
        fields = {"max_tokens": 60 if index % 10 == 0 else 4, "stream": index % 7 == 0}
        if fields["stream"]:
            body = json.dumps({"messages": HELLO, "temperature": 0, **fields}).encode()
            sent = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                          headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(sent, timeout=TIMEOUT_S) as response:
                assert b"data:" in response.read()
                return 200, response.status
        return 200, chat(port, **fields)[0]

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(120)))
    assert all(expected == got for expected, got in outcomes), outcomes
    assert "Traceback" not in log.read_text()


def test_sigterm_stops_the_server_within_seconds_even_mid_answer(server):
    port, process, _ = server
    body = json.dumps({"messages": HELLO, "max_tokens": 240, "stream": True}).encode()
    sent = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(sent, timeout=TIMEOUT_S) as response:
        response.readline()  # the answer has begun
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert process.returncode is not None
