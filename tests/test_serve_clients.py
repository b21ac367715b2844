"""Slow and lying clients on real sockets cannot take `tuner serve` from the others (issue #48): a header sent a byte
a second is cut at the header deadline and takes no request's place, a body shorter than its Content-Length is
answered 408 at the body deadline, a chat template past its bound answers its own request with an error, and
/health reports a request served past its budget.

One server (the demo model, whose template spins on the message SPIN and doubles a text on GROW) is shared by the
tests of this module."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO
from test_serve import free_port, wait_until_serving
from test_serve_limits import HELLO, request
from test_template_bounds import DOUBLING, NESTED_LOOPS, model_with_template
from tuner.data.chat_template import MAX_CHARS_ENV, TIMEOUT_ENV
from tuner.infer.connection_limits import HEADER_TIMEOUT_S
from tuner.infer.request_limits import BODY_TIMEOUT_S

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("serve-clients")]
TEMPLATE_S = 9  # the server's template bound: longer than the request budget (1 s) and the slack (5 s)


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_model_path):
    honest = (demo_model_path / "chat_template.jinja").read_text()
    template = (f"{{% if messages[-1]['content'] == 'SPIN' %}}{NESTED_LOOPS}{{% elif messages[-1]['content'] == "
                f"'GROW' %}}{DOUBLING}{{% else %}}{honest}{{% endif %}}")
    folder = tmp_path_factory.mktemp("serve-clients")
    model = model_with_template(folder, demo_model_path, template, "chat_template.jinja")
    port = free_port()
    log = folder / "server.log"
    with open(log, "w") as stream:
        process = subprocess.Popen([sys.executable, "-m", "tuner", "serve", "--model", str(model), "--port",
                                    str(port), "--request-timeout", "1"], stdout=stream, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(REPO), TIMEOUT_ENV: str(TEMPLATE_S)})
    wait_until_serving(port, process, log.read_text)
    yield port, model, log
    process.kill()
    process.wait()


def chat(port: int, content: str = HELLO[0]["content"]) -> tuple[int, dict]:
    return request(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": content}],
                                                  "temperature": 0, "max_tokens": 3})


def closed_by_server(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing ``sock`` (None: still open after ``within`` seconds)."""
    sock.settimeout(within)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return received


def test_fifty_slowloris_sockets_take_no_place_and_are_cut_at_the_header_deadline(server):
    port, _, log = server
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    stop = threading.Event()

    def trickle():  # one header byte a second on each socket, as in the issue
        for byte in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n":
            for sock in sockets:
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    pass
            if stop.wait(1):
                return

    writer = threading.Thread(target=trickle, daemon=True)
    writer.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: chat(port), range(16)))
        assert [status for status, _ in answers] == [200] * 16, answers
        assert request(port, "/health", method="GET")[0] == 200
        for sock in sockets:  # none ever completed its headers: each is closed, with nothing sent
            assert closed_by_server(sock, within=HEADER_TIMEOUT_S + 20) == b""
    finally:
        stop.set()
        for sock in sockets:
            sock.close()
    assert "Traceback" not in log.read_text()


def test_a_content_length_longer_than_the_body_is_answered_408_at_the_body_deadline(server):
    port, _, log = server
    liars = []
    for _ in range(40):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"messages\": ")
        liars.append(sock)
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: chat(port), range(16)))
        assert [status for status, _ in answers] == [200] * 16, answers
        for sock in liars:
            answer = closed_by_server(sock, within=BODY_TIMEOUT_S + 20)
            assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
            assert b"did not arrive within" in answer and b"13 of 1000 bytes" in answer
    finally:
        for sock in liars:
            sock.close()
    assert "Traceback" not in log.read_text()


def test_a_template_past_its_bound_answers_its_request_and_health_reports_it_while_stuck(server):
    port, model, log = server
    status, answer = chat(port, "GROW")
    assert status == 500 and MAX_CHARS_ENV in answer["error"]["message"], answer
    assert str(model / "chat_template.jinja") in answer["error"]["message"]

    with ThreadPoolExecutor(1) as pool:
        spinning = pool.submit(chat, port, "SPIN")
        health = (200, {})
        for _ in range(60):  # the spinning request passes its budget (1 s) and the slack (5 s) long before 9 s
            health = request(port, "/health", method="GET")
            if health[0] == 503 or spinning.done():
                break
            time.sleep(0.5)
        assert health[0] == 503 and health[1]["status"] == "stuck", health
        assert "--request-timeout" in health[1]["message"]
        assert chat(port)[0] == 200 and request(port, "/v1/models", method="GET")[0] == 200  # others are served
        status, answer = spinning.result(timeout=60)
    assert status == 500 and TIMEOUT_ENV in answer["error"]["message"], answer
    assert str(model / "chat_template.jinja") in answer["error"]["message"]
    assert request(port, "/health", method="GET")[0] == 200
    assert "Traceback" not in log.read_text()


def test_chat_template_kwargs_are_refused(server):
    port, _, _ = server
    status, answer = request(port, "/v1/chat/completions", {"messages": HELLO, "chat_template_kwargs": {"x": 1}})
    assert status == 400 and answer["error"]["param"] == "chat_template_kwargs"
    assert json.dumps(answer)  # a JSON error, not a traceback
