"""Nothing lost, nothing clobbered: crashes between write and rename, and --force.

Every file tuner writes goes through :mod:`tuner.fileio`; a grep over the source keeps it so.
"""
from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.fileio import atomic_write_directory, atomic_write_text

REPO = Path(__file__).resolve().parents[1]
OLD = "version: 1\nname: precious\n"


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_crash_between_write_and_rename_keeps_the_old_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "recipe.yaml"
    target.write_text(OLD)

    def crash(*_):
        raise OSError(errno.EIO, "simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        atomic_write_text(target, "name: half-written\n")
    assert target.read_text() == OLD
    assert leftovers(tmp_path) == []


def test_disk_full_while_writing_keeps_the_old_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "recipe.yaml"
    target.write_text(OLD)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        atomic_write_text(target, "x" * 10_000)
    assert target.read_text() == OLD
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_process_killed_between_write_and_rename_keeps_the_old_file(tmp_path) -> None:
    """SIGKILL cannot be cleaned up after: the old file must still be whole, and the next write must work."""
    target = tmp_path / "recipe.yaml"
    target.write_text(OLD)
    child = textwrap.dedent(f"""
        import os, signal
        from tuner.fileio import atomic_write_text
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        atomic_write_text({str(target)!r}, "name: never-renamed\\n")
    """)
    result = subprocess.run([sys.executable, "-c", child], env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert result.returncode == -signal.SIGKILL
    assert target.read_text() == OLD
    # what a kill leaves is a hidden temporary file with the complete new text, never read by tuner
    stale = leftovers(tmp_path)
    assert len(stale) == 1 and stale[0].startswith(".recipe.yaml.")
    assert atomic_write_text(target, "name: next\n").read_text() == "name: next\n"


def test_permissions_follow_the_umask_and_survive_a_rewrite(tmp_path) -> None:
    fresh = atomic_write_text(tmp_path / "new.yaml", "a: 1\n")
    umask = os.umask(0)
    os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    kept = tmp_path / "script.sh"
    kept.write_text("old")
    kept.chmod(0o750)
    atomic_write_text(kept, "new")
    assert kept.stat().st_mode & 0o777 == 0o750


def test_directory_appears_whole_or_not_at_all(tmp_path, monkeypatch) -> None:
    real_replace = os.replace
    calls = []

    def fail_on_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_second)
    with pytest.raises(OSError):
        atomic_write_directory(tmp_path / "run", {"a.yaml": "a", "b.yaml": "b", "c.sh": "c"})
    assert list(tmp_path.iterdir()) == []  # neither the run directory nor its staging copy
    monkeypatch.setattr(os, "replace", real_replace)
    run = atomic_write_directory(tmp_path / "run", {"a.yaml": "a", "launch.sh": "#!"}, modes={"launch.sh": 0o755})
    assert sorted(p.name for p in run.iterdir()) == ["a.yaml", "launch.sh"]
    assert os.access(run / "launch.sh", os.X_OK)
    with pytest.raises(OSError):  # never merged into a directory that appeared meanwhile
        atomic_write_directory(tmp_path / "run", {"z": "z"})
    assert not (run / "z").exists()


# -- the CLI never overwrites without --force ----------------------------------------------------------------

def cli(*args: str, capsys) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def test_recipes_cp_refuses_to_overwrite_without_force(tmp_path, capsys) -> None:
    dest = tmp_path / "mine.yaml"
    dest.write_text(OLD)
    code, err = cli("recipes", "cp", "demo", str(dest), capsys=capsys)
    assert code == 2 and "--force" in err and str(dest) in err
    assert dest.read_text() == OLD
    code, _ = cli("recipes", "cp", "demo", str(dest), "--force", capsys=capsys)
    assert code == 0 and "name: demo" in dest.read_text()
    assert leftovers(tmp_path) == []


def test_render_refuses_to_overwrite_without_force(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert cli("render", "demo", "-o", str(run_dir), capsys=capsys)[0] == 0
    lock = run_dir / "recipe.lock.yaml"
    code, err = cli("render", "demo", "-o", str(run_dir), "--set", "training.seed=7", capsys=capsys)
    assert code == 2 and "--force" in err and str(run_dir) in err
    assert cli("render", "demo", "-o", str(run_dir), "--set", "training.seed=7", "--force", capsys=capsys)[0] == 0
    assert "seed: 7" in lock.read_text()
    assert leftovers(run_dir) == []
    lock.write_text(OLD)  # the user's edit: the user's file from now on, kept even with --force
    code, err = cli("render", "demo", "-o", str(run_dir), "--force", capsys=capsys)
    assert code == 2 and "recipe.lock.yaml (changed since tuner wrote it)" in err
    assert lock.read_text() == OLD


# -- the rule itself -------------------------------------------------------------------------------------------

# (a YAML or JSON dump to a stream needs one of these opens too)
WRITES = re.compile(r"\.write_(text|bytes)\(|\bopen\([^)]*[\"'][wax]b?\+?[\"']|\bos\.open\(|json\.dump\(")


def test_every_file_tuner_writes_goes_through_fileio() -> None:
    offenders = []
    for path in sorted((REPO / "tuner").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative == "tuner/fileio.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if WRITES.search(code):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert offenders == [], ("write these with tuner.fileio.atomic_write_text (a file written whole) or "
                             "open_log (a log written as it goes):\n" + "\n".join(offenders))


# -- a full or foreign disk is a message, not a traceback ------------------------------------------------------

def test_disk_full_during_render_is_one_line_with_advice_and_leaves_no_run_directory(tmp_path, monkeypatch, capsys) -> None:
    real_replace, renamed = os.replace, []

    def full_after_one_file(src, dst):
        if renamed:
            raise OSError(errno.ENOSPC, "No space left on device")
        renamed.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_after_one_file)
    code, err = cli("render", "demo", "-o", str(tmp_path / "run"), capsys=capsys)
    assert code == 1 and renamed
    assert re.fullmatch(rf"error: {re.escape(str(tmp_path / 'run'))}/[a-z._]+: No space left on device "
                        r"\([0-9.]+ [MG]i?B free\); free some space, "
                        r"or point output.dir at a disk with room\.\n", err), err
    assert list(tmp_path.iterdir()) == []  # no half-written run directory, no staging directory


def test_unwritable_destination_names_the_file_not_its_temporary(capsys) -> None:
    code, err = cli("recipes", "cp", "demo", "/proc/tuner-test.yaml", capsys=capsys)  # /proc refuses even root
    assert code == 1 and err.startswith("error: /proc/tuner-test.yaml: ") and ".tmp" not in err
    code, err = cli("render", "demo", "-o", "/proc/tuner-test/run", capsys=capsys)
    assert code == 1 and err.startswith("error: /proc/tuner-test") and "Traceback" not in err


def test_run_with_an_unwritable_output_directory_stops_before_launching(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = cli("run", "demo", "--set", "output.dir=/proc/tuner-test/run", capsys=capsys)
    assert code == 2 and err.startswith("error: output.dir: output /proc/tuner-test/run: cannot write in /proc")
    assert not (tmp_path / "runs").exists()
