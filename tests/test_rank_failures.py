"""A rank that dies is named, with how it died and the last lines it printed."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tuner.launch.failures import RankError, describe_failure, explain_failure, rank_errors, rank_failures
from tuner.rundir.events import Error, Step

DYING_RANK = textwrap.dedent("""
    import os, signal, time
    rank = int(os.environ["RANK"])
    print(f"rank {rank} step 1 loss 2.0", flush=True)
    if rank == 1:
        print("rank 1 last words", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
""")


@pytest.mark.slow
def test_a_rank_killed_with_sigkill_is_named_with_its_last_lines(tmp_path) -> None:
    """Real torchrun (what accelerate launch runs for several processes), two CPU ranks, rank 1 killed."""
    script = tmp_path / "train.py"
    script.write_text(DYING_RANK)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode != 0
    lines = result.stdout.splitlines()
    root = rank_failures(lines)[0]
    assert (root.rank, root.exit_code, root.signal_name, root.root_cause) == (1, -9, "SIGKILL", True)
    message = describe_failure(lines, result.returncode)
    assert message[0].startswith("rank 1 (local rank 1") and "killed by SIGKILL" in message[0]
    assert "out-of-memory killer" in message[0]
    assert "  rank 1 last words" in message[message.index("last lines of the log:"):]


SUMMARY = """\
step 3 loss 2.0
ValueError: bad batch
E1130 00:07:18.727000 1 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0
=======================================================
train.py FAILED
-------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_00:07:18
  host      : node-a
  rank      : 8 (local_rank: 0)
  exitcode  : 1 (pid: 22371)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
=======================================================
"""


def test_a_python_error_on_another_node_names_global_rank_and_host() -> None:
    lines = SUMMARY.splitlines()
    failures = rank_failures(lines)
    assert len(failures) == 1 and failures[0].rank == 8 and failures[0].root_cause
    message = describe_failure(lines, 1)
    assert message[0] == "rank 8 (local rank 0 on node-a) exited with code 1."
    assert message[1:] == ["last lines of the log:", "  step 3 loss 2.0", "  ValueError: bad batch"]


def test_a_rank_that_spoke_is_explained_by_its_own_error() -> None:
    errors = rank_errors([Step(time=5.0), Error(time=1.0, rank=0, message="old"),
                          Error(time=6.0, rank=1, message="ValueError: bad batch"),
                          Error(time=7.0, rank=0, message="RuntimeError: peer gone")], since=2.0)
    assert errors == [RankError(1, "ValueError: bad batch"), RankError(0, "RuntimeError: peer gone")]
    assert explain_failure(errors, {"ValueError: bad batch": "train.py:7"}, SUMMARY.splitlines(), 1) == [
        "rank 1 failed: ValueError: bad batch (raised at train.py:7)"]
    killed = two_failures("2026-12-02_16:54:21")  # a rank killed by a signal: its peers' errors only echo it
    assert explain_failure(errors, {}, killed, 1)[0].startswith("rank 1 (local rank 1 on localhost) was killed")


def two_failures(killed_at: str) -> list[str]:
    """torchrun's summary when rank 1 was SIGKILLed and rank 0 then failed its collective (exit code 1)."""
    return textwrap.dedent(f"""\
        step 3
        =======================================================
        train.py FAILED
        -------------------------------------------------------
        Failures:
        [1]:
          time      : {killed_at}
          host      : localhost
          rank      : 1 (local_rank: 1)
          exitcode  : -9 (pid: 2)
          error_file: <N/A>
          traceback : Signal 9 (SIGKILL) received by PID 2
        -------------------------------------------------------
        Root Cause (first observed failure):
        [0]:
          time      : 2026-12-02_16:54:21
          host      : localhost
          rank      : 0 (local_rank: 0)
          exitcode  : 1 (pid: 1)
          error_file: <N/A>
        =======================================================
        """).splitlines()


def test_a_rank_killed_in_the_root_causes_second_is_the_story() -> None:
    """torchrun times failures in whole seconds and breaks a tie by local rank, so a peer's exit code 1 after a
    rank was SIGKILLed can be its "root cause" (CI saw this race); the killed rank is named first."""
    message = describe_failure(two_failures("2026-12-02_16:54:21"), 1)
    assert message[0].startswith("rank 1 (local rank 1 on localhost) was killed by SIGKILL")
    assert message[1] == "then the launcher stopped rank 0."
    later = describe_failure(two_failures("2026-12-02_16:54:52"), 1)  # e.g. the launcher's SIGKILL after SIGTERM
    assert later[0] == "rank 0 (local rank 0 on localhost) exited with code 1."


def test_a_single_process_killed_without_a_launcher_summary() -> None:
    message = describe_failure(["loading model", "step 10 loss 1.2"], -9)
    assert message[0].startswith("training was killed by SIGKILL")
    assert message[-2:] == ["  loading model", "  step 10 loss 1.2"]


def test_accelerate_chains_the_ranks_stderr_as_the_cause() -> None:
    """accelerate >= 1.16 raises ``CalledProcessError(...) from RuntimeError(<stderr tail>)``: that cause is the
    launcher's report, not the rank's last line, whether the rank wrote to stderr or not."""
    report = ["", "The above exception was the direct cause of the following exception:", "",
              "Traceback (most recent call last):", "  File \"launch.py\", line 1049, in _run_subprocess",
              "subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGKILL: 9>."]
    quiet = describe_failure(["only rank working", "RuntimeError", *report], 1)
    warned = describe_failure(["only rank working", "a warning", "RuntimeError: a warning", "", *report], 1)
    assert quiet[0].startswith("training was killed by SIGKILL") and quiet[1:] == ["  only rank working"]
    assert warned[1:] == ["  only rank working", "  a warning"]


def test_other_ranks_warnings_are_left_out_of_the_log() -> None:
    """torch prefixes its own warnings with [rankN]:; a rank's prints carry no prefix."""
    lines = ["[rank1]:[W1130 reducer.cpp:1529] Warning: find_unused_parameters=True", "step 5 loss 1.1",
             *SUMMARY.splitlines()[3:]]
    message = describe_failure(lines, 1)  # local rank 0 failed: rank 1's warning is not its story
    assert message[1].startswith("last lines of the log") and message[2:] == ["  step 5 loss 1.1"]


@pytest.mark.slow
def test_a_single_process_killed_under_accelerate_launch(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os, signal\nprint('only rank working', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--cpu", "--num_processes", "1",
         "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=tmp_path,  # as train.log
    )
    message = describe_failure(result.stdout.splitlines(), result.returncode)
    assert result.returncode == 1  # accelerate turns the signal into exit code 1 ...
    assert message[0].startswith("training was killed by SIGKILL")  # ... but its report still names it
    assert message[-1] == "  only rank working"


def test_the_training_exit_code_behind_accelerate_exit_code_1() -> None:
    lines = ["error: out of GPU memory. Next step on the memory ladder: ...", "Traceback (most recent call last):",
             "subprocess.CalledProcessError: Command '['python', '-m', 'tuner.train']' returned non-zero exit status 3."]
    message = describe_failure(lines, 1)
    assert message == ["training exited with code 3; last lines of the log:",
                       "  error: out of GPU memory. Next step on the memory ladder: ..."]


def test_error_events_with_brackets_are_printed_not_parsed() -> None:
    """A rank's error quoting '[/__w/pytorch/.../pair.cc:537]' once crashed the progress view as rich markup."""
    import io

    from rich.console import Console

    from tuner.launch.progress import ProgressView
    from tuner.rundir.events import parse_event

    out = io.StringIO()
    view = ProgressView(Console(file=out, width=200))
    view.update([parse_event({"event": "error", "message": "RuntimeError: [/__w/pytorch/gloo/pair.cc:537] Read error "
                                                       "[127.0.0.1]:55524"}),
                 parse_event({"event": "checkpoint", "path": "runs/[odd]/checkpoint-2"})])
    assert "[/__w/pytorch/gloo/pair.cc:537] Read error [127.0.0.1]:55524" in out.getvalue()
    assert "runs/[odd]/checkpoint-2" in out.getvalue()


LEAVING_RANK = textwrap.dedent("""
    import atexit, sys, threading, time
    from pathlib import Path
    from tuner.train.__main__ import leave
    out, code = Path(sys.argv[1]), int(sys.argv[2])
    atexit.register(lambda: (out / "atexit").write_text("trackers finished"))
    go = threading.Event()  # a failed rank's thread never goes: leave() must not wait for it
    threading.Thread(target=lambda: (go.wait(), time.sleep(0.5), (out / "thread").write_text("joined"))).start()
    if code == 0:
        go.set()
    print("last words")  # buffered: leave() flushes it
    leave(code, multi_rank=True)
    (out / "after").write_text("leave returned")
""")


@pytest.mark.parametrize("code", [0, 3])
def test_a_rank_leaves_with_its_code_after_a_normal_exits_work_only_when_it_succeeded(tmp_path, code) -> None:
    """A finished rank joins its threads and runs the atexit handlers (trackers) before skipping the teardown that
    aborts gloo ranks; a failed one leaves at once, its peers stuck in a collective."""
    script = tmp_path / "rank.py"
    script.write_text(LEAVING_RANK)
    result = subprocess.run([sys.executable, str(script), str(tmp_path), str(code)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == code and result.stdout == "last words\n", result.stderr
    assert not (tmp_path / "after").exists()
    assert (tmp_path / "atexit").exists() == (tmp_path / "thread").exists() == (code == 0)
