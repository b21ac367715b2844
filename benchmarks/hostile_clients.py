"""Hostile HTTP clients against a real ``tuner serve`` (the built-in demo model on 127.0.0.1), issue 48.

Generates client behaviours (seeded) over the classes that held the server before: slowloris headers (sockets
sending a byte every so often), lying ``Content-Length`` (a body shorter than declared), slow bodies, half-closed
sockets (the write side shut mid-request), floods (idle sockets, requests at once, connect-and-close), garbage
(bytes that are not HTTP, oversized headers, pipelined requests, chunked bodies trickled), and slow readers (a
streamed answer never read).  They run in batches of concurrent behaviours while a probe client sends a normal
chat request every half second; for each behaviour the script records when the server answered or closed its
sockets, and reports:

- bounded: every socket answered or closed within its limit (the header or body deadline, the request's time
  budget) plus SLACK_S;
- hang: a socket the server still held open past that;
- and, per batch, probe requests that did not get a 200 (a starved client; a 503 while a flood holds more than
  the cap of requests at once is the cap, counted apart), and tracebacks in the server's log.

Run: nice -n 10 python benchmarks/hostile_clients.py [--behaviours 120] [--seed 48]
(results in benchmarks/results/hostile-clients_<date>_cpu.md)
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
SLACK_S = 5.0
REQUEST_TIMEOUT_S = 5  # the server's --request-timeout
BATCH = 12
# the model generates one answer at a time, each within its budget: a request may wait behind the 32 others served
WAIT_BOUND_S = REQUEST_TIMEOUT_S * 33
CHAT = json.dumps({"messages": [{"role": "user", "content": "reverse\nabc"}], "max_tokens": 3}).encode()


def head(length: int | None = None, extra: bytes = b"") -> bytes:
    line = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return line + (b"Content-Length: %d\r\n" % length if length is not None else b"") + extra + b"\r\n"


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(0.2)
    return sock


def drain(sock: socket.socket) -> bool:
    """True once the server closed ``sock`` (what it sent before is read and dropped)."""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


def watch(socks: list[socket.socket], limit_s: float, feed=None) -> float | None:
    """Seconds until the server closed every socket in ``socks`` (``feed(elapsed)`` called between looks: the
    behaviour's own trickle), or None when one was still open at ``limit_s`` + SLACK_S."""
    started = time.monotonic()
    open_ = list(socks)
    while open_:
        elapsed = time.monotonic() - started
        if elapsed > limit_s + SLACK_S:
            return None
        if feed is not None:
            feed(elapsed, open_)
        open_ = [sock for sock in open_ if not drain(sock)]
    return time.monotonic() - started


def send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def slowloris(rng: random.Random):
    count, every = rng.choice([1, 5, 20, 50]), rng.choice([0.3, 1.0, 3.0])
    text = head(len(CHAT))

    def run(port: int, header_s: float, body_s: float):
        socks = [connect(port) for _ in range(count)]
        sent = collections.Counter()

        def feed(elapsed, open_):
            for sock in open_:
                index = sent[id(sock)]
                if elapsed >= index * every and index < len(text) - 2:  # never the blank line that ends them
                    send_quietly(sock, text[index:index + 1])
                    sent[id(sock)] += 1
        return watch(socks, header_s, feed), header_s
    return f"slowloris: {count} sockets, a header byte every {every:g} s", run


def lying_length(rng: random.Random):
    declared = rng.choice([100, 1000, 100000])
    fraction = rng.choice([0.0, 0.3, 0.9])

    def run(port: int, header_s: float, body_s: float):
        sock = connect(port)
        send_quietly(sock, head(declared) + b"{" + b" " * int(declared * fraction))
        return watch([sock], body_s), body_s
    return f"lying Content-Length: {declared} declared, {fraction:.0%} sent", run


def slow_body(rng: random.Random):
    every = rng.choice([0.5, 1.0, 2.0])

    def run(port: int, header_s: float, body_s: float):
        sock = connect(port)
        send_quietly(sock, head(len(CHAT)))
        sent = [0]

        def feed(elapsed, open_):
            if open_ and elapsed >= sent[0] * every and sent[0] < len(CHAT) - 1:
                send_quietly(sock, CHAT[sent[0]:sent[0] + 1])
                sent[0] += 1
        return watch([sock], body_s, feed), body_s
    return f"slow body: a byte every {every:g} s", run


def half_closed(rng: random.Random):
    part = rng.choice(["headers", "half the headers", "half the body", "the whole request"])

    def run(port: int, header_s: float, body_s: float):
        sock = connect(port)
        request = head(len(CHAT)) + CHAT
        cut = {"headers": len(head(len(CHAT))), "half the headers": 30, "half the body": len(request) - 20,
               "the whole request": len(request)}[part]
        send_quietly(sock, request[:cut])
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        return watch([sock], max(header_s, body_s, REQUEST_TIMEOUT_S)), max(header_s, body_s, REQUEST_TIMEOUT_S)
    return f"half-closed: after {part}", run


def flood(rng: random.Random):
    kind, count = rng.choice([("idle sockets", 50), ("idle sockets", 300), ("idle sockets", 800),
                              ("requests at once", 40), ("requests at once", 64),
                              ("connect and close", 500)])

    def run(port: int, header_s: float, body_s: float):
        if kind == "connect and close":
            for _ in range(count):
                connect(port).close()
            return 0.0, 0.0
        socks = [connect(port) for _ in range(count)]
        if kind == "requests at once":
            for sock in socks:
                send_quietly(sock, head(len(CHAT), b"Connection: close\r\n") + CHAT)
            limit = WAIT_BOUND_S
            return watch(socks, limit), limit
        return watch(socks, header_s), header_s
    return f"flood: {count} {kind}", run


def garbage(rng: random.Random):
    kind = rng.choice(["random bytes", "oversized header", "pipelined", "chunked trickle", "bad method",
                       "headers without end"])
    seed = rng.randrange(2**32)

    def run(port: int, header_s: float, body_s: float):
        sock = connect(port)
        noise = random.Random(seed)
        if kind == "random bytes":
            send_quietly(sock, bytes(noise.randrange(256) for _ in range(noise.randint(1, 4000))))
        elif kind == "oversized header":
            send_quietly(sock, b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
        elif kind == "pipelined":
            send_quietly(sock, (head(len(CHAT)) + CHAT) * 3)
        elif kind == "bad method":
            send_quietly(sock, b"BREW /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        elif kind == "headers without end":
            send_quietly(sock, b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 100)
        else:
            send_quietly(sock, head(None, b"Transfer-Encoding: chunked\r\n"))
            step = [0]

            def feed(elapsed, open_):
                if open_ and elapsed >= step[0]:
                    send_quietly(sock, b"1\r\n \r\n")
                    step[0] += 1
            return watch([sock], body_s, feed), body_s
        limit = WAIT_BOUND_S if kind == "pipelined" else max(header_s, body_s, REQUEST_TIMEOUT_S * 3)  # 3 answers
        return watch([sock], limit), limit
    return f"garbage: {kind}", run


def slow_reader(rng: random.Random):
    streams = rng.choice([1, 4, 8])

    def run(port: int, header_s: float, body_s: float):
        body = json.dumps({"messages": [{"role": "user", "content": "reverse\nabc"}], "stream": True,
                           "max_tokens": 40}).encode()
        socks = [connect(port) for _ in range(streams)]
        for sock in socks:
            send_quietly(sock, head(len(body), b"Connection: close\r\n") + body)
        time.sleep(REQUEST_TIMEOUT_S)  # never read while it generates
        limit = WAIT_BOUND_S  # its answers wait behind the batch's other generations
        return watch(socks, limit), limit
    return f"slow reader: {streams} streamed answers not read", run


FAMILIES = [slowloris, lying_length, slow_body, half_closed, flood, garbage, slow_reader]


def probe(port: int, stop: threading.Event, results: list) -> None:
    while not stop.is_set():
        sent = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=CHAT, method="POST",
                                      headers={"Content-Type": "application/json"})
        started = time.monotonic()
        try:
            with urllib.request.urlopen(sent, timeout=WAIT_BOUND_S) as response:
                results.append((response.status, time.monotonic() - started))
        except urllib.error.HTTPError as error:
            results.append((error.code, time.monotonic() - started))
        except OSError as error:
            results.append((type(error).__name__, time.monotonic() - started))
        stop.wait(0.5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--behaviours", type=int, default=120)
    parser.add_argument("--seed", type=int, default=48)
    args = parser.parse_args()
    from tuner.infer.connection_limits import HEADER_TIMEOUT_S
    from tuner.infer.request_limits import BODY_TIMEOUT_S, MAX_ACTIVE_REQUESTS
    from tuner.loading.demo_model import builtin_model_path

    rng = random.Random(args.seed)
    behaviours = [FAMILIES[index % len(FAMILIES)](rng) for index in range(args.behaviours)]
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="hostile-clients-")) / "server.log"
    with open(log, "w") as stream:
        server = subprocess.Popen([sys.executable, "-m", "tuner", "serve", "--model",
                                   str(builtin_model_path("builtin:demo")), "--port", str(port), "--request-timeout",
                                   str(REQUEST_TIMEOUT_S)], stdout=stream, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            break
        except OSError:
            time.sleep(1)
    rows, probes_all, started = [], [], time.monotonic()
    try:
        for first in range(0, len(behaviours), BATCH):
            batch = behaviours[first:first + BATCH]
            stop, probes = threading.Event(), []
            prober = threading.Thread(target=probe, args=(port, stop, probes))
            prober.start()
            outcomes: list = [None] * len(batch)

            def one(index, run):
                try:
                    outcomes[index] = run(port, HEADER_TIMEOUT_S, BODY_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001: a client-side failure is reported, not raised
                    outcomes[index] = ("client error", f"{type(exc).__name__}: {exc}")
            threads = [threading.Thread(target=one, args=(i, run)) for i, (_, run) in enumerate(batch)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            stop.set()
            prober.join()
            # 503 while more than MAX_ACTIVE_REQUESTS requests are in is the cap doing its work, not starvation
            capped = any("requests at once" in name and int(name.split()[1]) > MAX_ACTIVE_REQUESTS for name, _ in batch)
            starved = [p for p in probes if p[0] != 200 and not (capped and p[0] == 503)]
            probes_all += [(status, seconds, capped) for status, seconds in probes]
            for (name, _), outcome in zip(batch, outcomes):
                seconds, limit = outcome
                verdict = "bounded" if isinstance(seconds, float) else "hang" if seconds is None else "client error"
                rows.append((name, verdict, seconds, limit, len(starved)))
                print(name, verdict, seconds, limit, f"probes {len(probes)} starved {len(starved)}", flush=True)
    finally:
        server.kill()
        server.wait()
    text = log.read_text()
    tracebacks = text.count("Traceback")
    by_family = collections.defaultdict(collections.Counter)
    for name, verdict, *_ in rows:
        by_family[name.split(":")[0]][verdict] += 1
    latencies = sorted(seconds for status, seconds, _ in probes_all if status == 200)
    capped_total = sum(1 for status, _, capped in probes_all if status == 503 and capped)
    starved_total = sum(1 for status, _, capped in probes_all if status != 200 and not (capped and status == 503))
    lines = [f"# Hostile HTTP clients, {datetime.date.today()} (CPU)", "",
             f"`python benchmarks/hostile_clients.py --behaviours {args.behaviours} --seed {args.seed}`: "
             f"{len(rows)} client behaviours against `tuner serve --model builtin:demo --request-timeout "
             f"{REQUEST_TIMEOUT_S}` on 127.0.0.1, {BATCH} at a time, a probe client sending a normal chat request every "
             f"0.5 s throughout; header deadline {HEADER_TIMEOUT_S:g} s, body deadline {BODY_TIMEOUT_S:g} s, a hang is a "
             f"socket still held past its limit + {SLACK_S:g} s. {time.monotonic() - started:.0f} s in all.", "",
             "| class | behaviours | bounded | hang | client error |", "|---|---|---|---|---|"]
    for family, counts in by_family.items():
        lines.append(f"| {family} | {sum(counts.values())} | {counts['bounded']} | {counts['hang']} | "
                     f"{counts['client error']} |")
    total = sum(by_family.values(), collections.Counter())
    lines += [f"| **all** | {sum(total.values())} | {total['bounded']} | {total['hang']} | {total['client error']} |",
              "", f"Probe requests: {len(probes_all)}; 503 while a flood held more than {MAX_ACTIVE_REQUESTS} requests "
                  f"(the cap, by design): {capped_total}; otherwise not answered 200 (starved): {starved_total}; "
                  "probe latency median "
                  f"{latencies[len(latencies) // 2] if latencies else float('nan'):.2f} s, worst "
                  f"{latencies[-1] if latencies else float('nan'):.2f} s. Tracebacks in the server's log: {tracebacks}.",
              "", "| behaviour | verdict | seconds to answered/closed | limit s | probes starved in its batch |",
              "|---|---|---|---|---|"]
    lines += [f"| {name} | {verdict} | {seconds if not isinstance(seconds, float) else f'{seconds:.1f}'} | "
              f"{limit if not isinstance(limit, float) else f'{limit:g}'} | {starved} |"
              for name, verdict, seconds, limit, starved in rows]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"hostile-clients_{datetime.date.today()}_cpu.md"
    out.write_text("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()
