"""A full disk anywhere is one message naming the path and the room left: the log thread of a launch, a rank's
checkpoint save (torch's "unexpected pos" names neither), a command's write; sizes under 0.1 GiB in MB."""
from __future__ import annotations

import errno
import io
import json
import subprocess
import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.disk_messages import disk_full, disk_full_message, disk_size, os_error_message

GIB = 2 ** 30


@given(st.floats(min_value=0, max_value=2 ** 60, allow_nan=False))
def test_sizes_below_a_tenth_of_a_gib_are_shown_in_mb(count) -> None:
    shown = disk_size(count)
    if count < 0.1 * GIB:
        assert shown.endswith(" MB") and float(shown[:-3]) == pytest.approx(count / 1e6, abs=0.051)
    else:
        assert shown.endswith(" GiB") and float(shown[:-4]) >= 0.1
    assert shown not in ("0.0 GiB",)


def test_a_tiny_checkpoint_need_is_shown_in_mb(tmp_path) -> None:
    """The demo's checkpoints need a few MB: the check said "checkpoints need ~0.0 GiB" (then ~0.1 GiB)."""
    from tuner.free_space import disk_room
    from tuner.planner import plan
    from tuner.recipe.io import load_recipe
    from tuner.recipe.registry import builtin_path

    recipe = load_recipe(builtin_path("demo"), [f"output.dir={tmp_path / 'run'}"])
    check = disk_room(recipe, plan(recipe))
    assert check.status == "ok" and " MB" in check.detail.split("checkpoints need ~")[1], check.detail


def full(*args) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", *args)


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__context__ = inner
    return outer


FULL_DISKS = [
    full(), OSError(errno.EDQUOT, "Disk quota exceeded"),
    chained(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"), full()),
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),  # a real fd: no OSError
    RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
    Exception('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'),
]
NOT_FULL = [OSError(errno.ENOENT, "No such file or directory"), OSError(errno.EACCES, "Permission denied"),
            RuntimeError("CUDA error: an illegal memory access"), ValueError("pos 3")]


@pytest.mark.parametrize("exc", FULL_DISKS + NOT_FULL)
def test_a_full_disk_is_known_in_every_library_s_words(exc) -> None:
    assert disk_full(exc) == (exc in FULL_DISKS)


@given(depth=st.integers(0, 5), kind=st.sampled_from(FULL_DISKS + NOT_FULL))
def test_a_full_disk_is_found_however_deep_it_was_raised(depth, kind) -> None:
    exc = kind
    for level in range(depth):
        exc = chained(RuntimeError(f"wrapped {level}"), exc)
    assert disk_full(exc) == (kind in FULL_DISKS)


def test_the_message_names_the_path_and_the_room_left(tmp_path) -> None:
    message = disk_full_message(tmp_path / "run", RuntimeError("unexpected pos 1 vs 2"))
    assert message.startswith(f"{tmp_path / 'run'}: the disk is full (") and " free) and the write failed" in message
    assert "\n" not in message and "unexpected pos" not in message
    told = os_error_message(full(str(tmp_path / "run" / "train.log")))
    assert told.startswith(f"{tmp_path / 'run' / 'train.log'}: No space left on device (") and " free); free some" in told


class FullDisk(io.TextIOBase):
    """A log file on a disk that fills after ``room`` characters: write raises ENOSPC, as the kernel's would."""

    def __init__(self, room: int):
        self.room, self.written = room, ""

    def write(self, text: str) -> int:
        if len(self.written) + len(text) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written += text
        return len(text)


def test_the_log_thread_gives_up_the_log_not_the_run(tmp_path) -> None:
    """The child prints once the full log is in place; every line still reaches the tail, the thread raises nothing
    (it did: OSError [Errno 28] in _pump) and the launch says once where and how much room is left."""
    from tuner.launch.runner import Launch

    gate = tmp_path / "go"
    script = ("import os, time\nwhile not os.path.exists(%r):\n    time.sleep(0.01)\n"
              "for i in range(200):\n    print('line', i)\n" % str(gate))
    raised = []
    previous, threading.excepthook = threading.excepthook, raised.append
    try:
        launch = Launch([sys.executable, "-c", script], tmp_path)
        launch._log.close()
        launch._log = FullDisk(room=50)
        gate.touch()
        assert launch.finish() == 0
    finally:
        threading.excepthook = previous
    assert raised == [] and launch.tail[-1] == "line 199"
    assert launch.log_problem.startswith(f"the run's log stopped: {tmp_path / 'train.log'}: No space left on device (")
    assert "free); free some space" in launch.log_problem


def test_a_rank_whose_checkpoint_finds_the_disk_full_says_so_once(tmp_path, monkeypatch, capsys) -> None:
    """torch.save into a file the disk refuses (its C++ writer then raises "unexpected pos"): one line naming the run
    directory and the room left, an error event of kind disk_full, exit code 1, no traceback."""
    import torch

    import tuner.train.__main__ as entry
    from tuner.recipe.io import load_recipe, recipe_to_yaml
    from tuner.recipe.registry import builtin_path

    lock = tmp_path / "recipe.lock.yaml"
    lock.write_text(recipe_to_yaml(load_recipe(builtin_path("demo"), [f"output.dir={tmp_path}"])))

    class Refusing(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def train(recipe, run_dir, profile):  # the Trainer's checkpoint save: torch.save of the optimizer state
        torch.save({"state": torch.zeros(1000)}, Refusing())

    monkeypatch.setattr(entry, "train", train)
    assert entry.main([str(lock)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path}: the disk is full (") and err.count("\n") == 1, err
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "error" and events[-1]["kind"] == "disk_full"
