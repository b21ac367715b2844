"""Every log tuner writes as things happen -- a run's events and train.log (the launcher's and the libraries'), the
libraries' own log, the wizard's tui.log -- refuses what was planted at its name instead of a file: a symbolic link
(to a file, a folder, or nowhere) or a FIFO. The link's target is never written or created, and the refusal is an
OSError naming the path, which the command line prints as one line."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tuner.fileio import NotARegularFile, open_log
from tuner.launch.runner import Launch
from tuner.rundir.events import Started, write_event
from tuner.rundir.layout import EVENTS_FILE, LOG_FILE
from tuner.rundir.library_output import output_to_log
from tuner.tui.output import library_output_to

TARGET_TEXT = "the user's own file\n"


def _events(run_dir: Path) -> Path:
    write_event(run_dir / EVENTS_FILE, Started(max_steps=1))
    return run_dir / EVENTS_FILE


def _train_log(run_dir: Path) -> Path:
    with output_to_log(run_dir / LOG_FILE):
        print("a library's bar")
    return run_dir / LOG_FILE


def _launch_log(run_dir: Path) -> Path:
    launch = Launch([sys.executable, "-c", "print('rank output')"], run_dir)
    launch.finish()  # reached only when the log opened: the test then fails on the planted entry being written
    return run_dir / LOG_FILE


def _wizard_log(run_dir: Path) -> Path:
    with library_output_to(run_dir / "tui.log"):
        os.write(1, b"a child's output\n")
    return run_dir / "tui.log"


WRITERS = {"events": (_events, EVENTS_FILE), "train.log": (_train_log, LOG_FILE),
           "launcher's train.log": (_launch_log, LOG_FILE), "tui.log": (_wizard_log, "tui.log")}
PLANTED = ("link to a file", "link to nowhere", "link to a folder", "fifo")


def _plant(entry: Path, kind: str, outside: Path) -> Path:
    """Put ``kind`` at ``entry``; returns what a write through it would reach."""
    target = outside / "target"
    if kind == "link to a file":
        target.write_text(TARGET_TEXT)
    elif kind == "link to a folder":
        target.mkdir()
    if kind == "fifo":
        os.mkfifo(entry)
        return entry
    entry.symlink_to(target)
    return target


@settings(max_examples=24, deadline=None)
@given(writer=st.sampled_from(sorted(WRITERS)), kind=st.sampled_from(PLANTED), earlier=st.booleans())
def test_a_log_never_writes_through_what_was_planted_at_its_name(tmp_path_factory, writer, kind, earlier):
    root = tmp_path_factory.mktemp("logs")
    run_dir, outside = root / "run", root / "elsewhere"
    run_dir.mkdir()
    outside.mkdir()
    write, name = WRITERS[writer]
    if earlier:  # the log had been written before (a resumed run, a second wizard session): the plant replaces it
        write(run_dir)
        (run_dir / name).unlink()
    reached = _plant(run_dir / name, kind, outside)
    with pytest.raises(OSError) as refused:
        write(run_dir)
    assert str(run_dir / name) in str(refused.value)
    if kind == "link to a file":
        assert reached.read_text() == TARGET_TEXT
    elif kind == "link to nowhere":
        assert not reached.exists()
    elif kind == "link to a folder":
        assert list(reached.iterdir()) == []
    assert os.isatty(1) or sys.stdout is not None  # the descriptors came back: pytest's capture still works
    print("still printing")


def test_open_log_appends_or_begins_afresh(tmp_path):
    log = tmp_path / "a.log"
    for text in ("one\n", "two\n"):
        with open_log(log) as stream:
            stream.write(text)
    assert log.read_text() == "one\ntwo\n"
    with open_log(log, fresh=True, binary=True) as stream:
        stream.write(b"three\n")
    assert log.read_text() == "three\n"
    log.unlink()
    log.symlink_to(tmp_path / "other")
    with pytest.raises(NotARegularFile, match="symbolic link"):
        open_log(log)
