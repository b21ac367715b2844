"""build_once with real processes racing for one cache: one builds while the others wait, a builder killed mid-build
leaves nothing that looks complete and is taken over, a frozen builder (as a vanished machine looks) is taken over
once its lease runs out, and a builder that lives but never finishes stops its waiters with a message naming it.
The demo model is whole whichever rank of a process group builds it."""
from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cpu_ranks import free_port

from conftest import REPO
from tuner.build_once import BUILT_MARKER, build_once, is_built, lock_path

# One process asking for the cache TARGET: its build writes half, says "building", waits for the file GATE, then
# writes the rest; the process says whether it built the cache or read another's.
ASKER = textwrap.dedent("""
    import logging, os, sys, time
    from pathlib import Path
    from tuner.build_once import BuildTimeout, build_once

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    target, gate, lease, timeout = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])

    def build(staging):
        (staging / "half").write_text("written before the gate")
        print("building", flush=True)
        while not gate.exists():
            time.sleep(0.02)
        (staging / "whole").write_text(str(os.getpid()))
        return os.getpid()

    try:
        built = build_once(target, build, what="the test cache", timeout=timeout, lease=lease)
    except BuildTimeout as exc:
        print(f"gave up: {exc}", flush=True)
        sys.exit(3)
    print("built it" if built else "read it", (target / "whole").read_text(), flush=True)
""")


def ask(target: Path, gate: Path, lease: float = 60.0, timeout: float = 120.0) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", ASKER, str(target), str(gate), str(lease), str(timeout)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    process.lines = queue.Queue()  # every line as it comes, then None: read by a thread, never left in a buffer
    threading.Thread(target=_read_lines, args=(process,), daemon=True).start()
    return process


def _read_lines(process: subprocess.Popen) -> None:
    for line in process.stdout:
        process.lines.put(line)
    process.lines.put(None)


def wait_for_line(process: subprocess.Popen, text: str, timeout: float = 120) -> str:
    """The first line of ``process``'s output that holds ``text``; fails (never hangs) if none comes.

    Lines come from a reader thread: waiting on the pipe itself would miss lines that an earlier read already took
    into the file object's buffer (several lines written at once, as a loaded machine delivers them)."""
    deadline, seen = time.monotonic() + timeout, []
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = process.lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        if text in line:
            return line
        seen.append(line)
    raise AssertionError(f"no line with {text!r} from pid {process.pid} (exit {process.poll()}); it said:\n"
                         + "".join(seen))


def finish(process: subprocess.Popen) -> tuple[int, str]:
    """The exit code and the lines ``process`` wrote that no :func:`wait_for_line` took."""
    process.wait(timeout=120)
    rest = []
    while (line := process.lines.get(timeout=60)) is not None:
        rest.append(line)
    return process.returncode, "".join(rest)


@pytest.fixture
def askers():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:  # nothing outlives the test
        if process.poll() is None:
            process.kill()
            process.wait()


def leftovers(target: Path) -> list[str]:
    return sorted(path.name for path in target.parent.iterdir() if path.name != target.name)


def test_processes_that_ask_at_once_build_it_once_and_read_it_whole(tmp_path, askers):
    target, gate = tmp_path / "cache", tmp_path / "gate"
    builder = ask(target, gate)
    askers.append(builder)
    wait_for_line(builder, "building")
    waiters = [ask(target, gate) for _ in range(3)]
    askers.extend(waiters)
    for waiter in waiters:  # each found the lock held, named its holder, and did not build
        assert f"pid {builder.pid} on host {socket.gethostname()} is building it" in wait_for_line(waiter, "waiting")
    assert not target.exists()  # nothing to read while it is being built
    gate.touch()
    code, output = finish(builder)
    assert code == 0 and f"built it {builder.pid}" in output, output
    for waiter in waiters:
        code, output = finish(waiter)
        assert code == 0 and f"read it {builder.pid}" in output and "building" not in output, output
    assert is_built(target) and sorted(path.name for path in target.iterdir()) == [BUILT_MARKER, "half", "whole"]
    assert leftovers(target) == ["gate"]  # no lock, no staging folder


def test_a_builder_killed_mid_build_leaves_no_cache_and_its_waiter_builds_it(tmp_path, askers):
    target, gate = tmp_path / "cache", tmp_path / "gate"
    builder = ask(target, gate)
    askers.append(builder)
    wait_for_line(builder, "building")
    waiter = ask(target, gate)
    askers.append(waiter)
    wait_for_line(waiter, "waiting")
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    # the killed build left its half in a hidden folder, never at the cache's name
    assert not is_built(target) and not target.exists()
    wait_for_line(waiter, f"pid {builder.pid} on host {socket.gethostname()} did not finish the test cache")
    assert "left by a build of the test cache that did not finish" in wait_for_line(waiter, "removing")
    wait_for_line(waiter, "building")
    gate.touch()
    code, output = finish(waiter)
    assert code == 0 and f"built it {waiter.pid}" in output, output
    assert is_built(target) and leftovers(target) == ["gate"]


def test_a_frozen_builder_is_taken_over_once_its_lease_runs_out(tmp_path, askers):
    """A stopped process refreshes nothing, as a machine that vanished: its pid lives, so only the lease frees it."""
    target, gate = tmp_path / "cache", tmp_path / "gate"
    builder = ask(target, gate, lease=1.5)
    askers.append(builder)
    wait_for_line(builder, "building")
    builder.send_signal(signal.SIGSTOP)
    waiter = ask(target, gate, lease=1.5)
    askers.append(waiter)
    wait_for_line(waiter, "waiting")
    wait_for_line(waiter, "did not finish the test cache")
    wait_for_line(waiter, "building")
    gate.touch()
    code, output = finish(waiter)
    assert code == 0 and f"built it {waiter.pid}" in output, output
    assert (target / "whole").read_text() == str(waiter.pid)


def test_a_builder_that_never_finishes_stops_its_waiter_with_a_message_naming_it(tmp_path, askers):
    target, gate = tmp_path / "cache", tmp_path / "gate"
    builder = ask(target, gate)
    askers.append(builder)
    wait_for_line(builder, "building")
    code, output = finish(ask(target, gate, timeout=1))
    assert code == 3, output
    message = output.split("gave up: ", 1)[1]
    assert message.startswith(f"the test cache in {target} is still not built after 1 s: pid {builder.pid} on host "
                              f"{socket.gethostname()} holds its lock ({lock_path(target)})"), message
    assert "stop it" in message and "TUNER_CACHE_TIMEOUT" in message
    gate.touch()
    assert finish(builder)[0] == 0 and is_built(target)


def test_a_build_that_fails_publishes_nothing_and_the_next_one_builds(tmp_path):
    target = tmp_path / "cache"

    def failing(staging: Path):
        (staging / "half").write_text("x")
        raise ValueError("the build failed")

    with pytest.raises(ValueError, match="the build failed"):
        build_once(target, failing, what="the test cache")
    assert not target.exists() and leftovers(target) == []
    assert build_once(target, lambda staging: (staging / "whole").write_text("x"), what="the test cache") == 1
    assert build_once(target, failing, what="the test cache") is None  # complete: not built again


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(st.sampled_from([None, "a", "b", "c"]), min_size=1, max_size=8))
def test_a_cache_is_built_again_exactly_when_its_spec_changes(specs):
    """Any sequence of asks: a cache is built on the first ask, again on an ask with a spec other than the one it was
    built from, and never on an ask without a spec or with its own; what is read is always the last build's."""
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "cache"
        built_from = "none yet"
        for number, spec in enumerate(specs):
            expected = built_from == "none yet" or (spec is not None and spec != built_from)
            value = build_once(target, lambda staging, n=number: (staging / "build").write_text(str(n)) or n,
                               what="the test cache", spec=spec)
            assert (value is not None) == expected, (specs, number)
            if expected:
                built_from, last = spec, number
            assert (target / "build").read_text() == str(last)
            assert is_built(target) and is_built(target, built_from) if built_from is not None else is_built(target)
            assert not is_built(target, "never used") and leftovers(target) == []


def test_a_marker_from_before_specs_is_not_current(tmp_path):
    """A home built by a tuner that wrote no spec (or a damaged marker) is complete but not known to be current."""
    target = tmp_path / "cache"
    target.mkdir()
    for marker in ('{"host": "h", "pid": 1, "built": 0}', "not json", "[]"):
        (target / BUILT_MARKER).write_text(marker)
        assert is_built(target) and not is_built(target, "spec")
    assert build_once(target, lambda staging: (staging / "new").write_text("x"), what="the test cache", spec="spec") \
        is not None
    assert is_built(target, "spec") and (target / "new").exists()


def test_a_built_in_model_s_spec_follows_what_it_is_built_from(monkeypatch):
    """Its config, its image settings and the builder's code each change the spec: an upgraded tuner rebuilds it."""
    import dataclasses

    from tuner.catalog import demo
    from tuner.loading import demo_model

    before = {model_id: demo_model.build_spec(model_id) for model_id in demo.BUILTIN_MODELS}
    assert len(set(before.values())) == len(before)  # each built-in model is its own
    model, vlm = demo.BUILTIN_MODELS[demo.DEMO_MODEL_ID], demo.BUILTIN_MODELS[demo.DEMO_VLM_MODEL_ID]
    for changed in (dataclasses.replace(model, config={**model.config, "hidden_size": 256}),
                    dataclasses.replace(model, architecture="MistralForCausalLM"),
                    dataclasses.replace(vlm, image={**vlm.image, "size": 64})):
        monkeypatch.setitem(demo.BUILTIN_MODELS, changed.id, changed)
        assert demo_model.build_spec(changed.id) != before[changed.id], changed
    monkeypatch.setitem(demo.BUILTIN_MODELS, demo.DEMO_MODEL_ID, model)
    monkeypatch.setitem(demo.BUILTIN_MODELS, demo.DEMO_VLM_MODEL_ID, vlm)
    assert {model_id: demo_model.build_spec(model_id) for model_id in demo.BUILTIN_MODELS} == before
    monkeypatch.setattr(demo_model, "__file__", demo.__file__)  # the builder's code changed
    assert demo_model.build_spec(demo.DEMO_MODEL_ID) != before[demo.DEMO_MODEL_ID]


def test_a_built_in_model_built_from_other_inputs_is_built_again(tmp_path, monkeypatch):
    """A home whose built-in model an earlier tuner built is not current: the next use builds it again, once."""
    from tuner.loading import demo_model

    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    builds = []
    monkeypatch.setattr(demo_model, "build_demo_model", lambda folder, model_id: builds.append(model_id))
    path = demo_model.builtin_model_path("builtin:demo-small")
    assert builds == ["builtin:demo-small"] and demo_model.is_current("builtin:demo-small")
    (path / BUILT_MARKER).write_text('{"host": "h", "pid": 1, "built": 0, "spec": "an earlier tuner"}')
    assert is_built(path) and not demo_model.is_current("builtin:demo-small")
    demo_model.builtin_model_path("builtin:demo-small")
    demo_model.builtin_model_path("builtin:demo-small")
    assert builds == ["builtin:demo-small"] * 2 and demo_model.is_current("builtin:demo-small")


RANK_ONE_BUILDS = textwrap.dedent("""
    import torch.distributed as dist
    from tuner.loading.demo_model import builtin_model_path

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        builtin_model_path("builtin:demo")
    dist.barrier()
""")


@pytest.mark.slow
def test_the_demo_model_built_by_a_rank_other_than_zero_is_whole(tmp_path):
    """Inside a process group transformers' save_pretrained writes no weights on ranks but 0; the demo model used to
    be saved there as a tokenizer alone, and the other ranks failed on its missing config.json."""
    from transformers import AutoModelForCausalLM

    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_HOME": str(tmp_path), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_ONE_BUILDS], env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    for process in ranks:
        output = process.communicate(timeout=300)[0]
        assert process.returncode == 0, output[-3000:]
    model = tmp_path / "models" / "demo"
    assert is_built(model)
    assert AutoModelForCausalLM.from_pretrained(model).num_parameters() > 0
