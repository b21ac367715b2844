"""Ownership by proof, not by name (issue 48): a file is tuner's only while the folder's manifest (tuner_files.json)
lists it with the same size and SHA-256.  The user's files under tuner's names, links, folders, a tuner file the user
edited, an older tuner's run: none is replaced or deleted by any command, --force included."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.hostile_folders import (BASES, CHANGES, COMMANDS, FOREIGN_NAMES, LINK_TARGETS, MANIFESTS, TUNER_NAMES,
                                        run_case)
from tuner.cli import main
from tuner.rundir.layout import ACCELERATE_CONFIG, EVENTS_FILE, LAUNCH_SCRIPT, LOCK_FILE, MANIFEST
from tuner.rundir.manifest import proved, read_manifest

MINE = {LAUNCH_SCRIPT: "mine\n", ACCELERATE_CONFIG: "mine\n"}


def cli(capsys, *args) -> tuple[int, str]:
    code = main([str(arg) for arg in args])
    return code, capsys.readouterr().err


def users_folder(path: Path) -> Path:
    path.mkdir()
    for name, text in MINE.items():
        (path / name).write_text(text)
    return path


# -- the reproductions of issue 48 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["run", "demo", "--set", "output.dir={v}", "--dry-run"],
                                  ["render", "demo", "-o", "{v}", "--force"],
                                  ["run", "demo", "--set", "output.dir={v}", "--resume", "--dry-run"]])
def test_the_users_launch_sh_and_accelerate_yaml_are_never_replaced(args, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    v = users_folder(tmp_path / "v")
    code, err = cli(capsys, *(arg.format(v=v) for arg in args))
    assert code == 2 and err.startswith(f"error: {v}: holds files tuner did not write (accelerate.yaml, launch.sh)")
    assert "Traceback" not in err and err.count("\n") == 1
    assert {path.name: path.read_text() for path in v.iterdir()} == MINE


def test_force_replaces_what_tuner_rendered_and_refuses_what_the_user_edited(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    assert sorted(proved(run)) == sorted([ACCELERATE_CONFIG, LAUNCH_SCRIPT, LOCK_FILE])
    assert cli(capsys, "render", "demo", "-o", run, "--set", "training.seed=7", "--force")[0] == 0
    assert "seed: 7" in (run / LOCK_FILE).read_text() and sorted(proved(run)) == sorted(read_manifest(run))
    (run / LAUNCH_SCRIPT).write_text((run / LAUNCH_SCRIPT).read_text() + "# my tweak\n")
    for args in (["render", "demo", "-o", run, "--force"], ["run", "demo", "--set", f"output.dir={run}", "--dry-run"],
                 ["run", "demo", "--set", f"output.dir={run}", "--resume", "--dry-run", "--force"]):
        code, err = cli(capsys, *args)
        assert code == 2 and "launch.sh (changed since tuner wrote it)" in err, err
        assert (run / LAUNCH_SCRIPT).read_text().endswith("# my tweak\n")


def test_a_link_at_a_tuner_name_is_the_users_and_never_followed(tmp_path, capsys):
    run, elsewhere = tmp_path / "run", tmp_path / "mine.sh"
    elsewhere.write_text("my script\n")
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    (run / LAUNCH_SCRIPT).unlink()
    (run / LAUNCH_SCRIPT).symlink_to(elsewhere)
    code, err = cli(capsys, "render", "demo", "-o", run, "--force")
    assert code == 2 and "launch.sh (a symbolic link)" in err
    assert (run / LAUNCH_SCRIPT).is_symlink() and elsewhere.read_text() == "my script\n"


def test_an_older_tuners_run_gets_one_message_and_is_adopted_after_a_look(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    (run / MANIFEST).unlink()  # as an older tuner left it
    (run / EVENTS_FILE).write_text('{"event": "started"}\n')
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    for args in (["render", "demo", "-o", run, "--force"], ["run", "demo", "--set", f"output.dir={run}", "--resume",
                                                          "--dry-run"]):
        code, err = cli(capsys, *args)
        assert code == 2 and err == (f"error: {run}: written by an older tuner, which kept no {MANIFEST} (the record of "
                                     "the files tuner wrote), so tuner cannot tell its files from yours there. Look "
                                     f"through the folder, then run `tuner adopt {run}` to record its files as tuner's, "
                                     "and run this again (or choose another folder).\n")
        assert {path.name: path.read_bytes() for path in run.iterdir()} == before
    assert cli(capsys, "adopt", run)[0] == 0
    assert sorted(read_manifest(run)) == sorted([ACCELERATE_CONFIG, LAUNCH_SCRIPT, LOCK_FILE])
    assert cli(capsys, "render", "demo", "-o", run, "--force")[0] == 0
    assert (run / EVENTS_FILE).read_text() == '{"event": "started"}\n'
    code, err = cli(capsys, "adopt", run)
    assert code == 2 and "already has its tuner_files.json" in err


def test_adopt_refuses_a_folder_no_tuner_wrote_and_what_no_tuner_writes(tmp_path, capsys):
    v = users_folder(tmp_path / "v")
    code, err = cli(capsys, "adopt", v)
    assert code == 2 and "not a folder an older tuner wrote" in err and not (v / MANIFEST).exists()
    (v / LOCK_FILE).write_text("version: 2\n")
    (v / "notes.md").write_text("mine")
    code, err = cli(capsys, "adopt", v)
    assert code == 2 and "holds what no tuner writes there (notes.md)" in err and not (v / MANIFEST).exists()
    (v / "notes.md").unlink()
    (v / MANIFEST).write_text('{"files": {"launch.sh": ')  # damaged, or the user's: never replaced, adopt included
    code, err = cli(capsys, "adopt", v)
    assert code == 2 and f"{v / MANIFEST}: not a record tuner can read" in err
    assert (v / MANIFEST).read_text() == '{"files": {"launch.sh": '


def test_an_older_merged_folder_is_adopted_from_its_list_of_names(tmp_path, capsys):
    from tuner.loading.merge import check_merge_output
    from tuner.loading.model import ModelLoadError

    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / "config.json").write_text("{}")
    (merged / MANIFEST).write_text(json.dumps({"written_by": "tuner merge", "files": ["config.json"]}))
    with pytest.raises(ModelLoadError, match="written by an older tuner"):
        check_merge_output(merged, tmp_path / "run" / "final", force=True)
    assert cli(capsys, "adopt", merged)[0] == 0
    check_merge_output(merged, tmp_path / "run" / "final", force=True)


# -- the class: any folder, any command --------------------------------------------------------------------------

change = st.one_of(
    st.tuples(st.just("bytes"), st.sampled_from(TUNER_NAMES + FOREIGN_NAMES), st.binary(max_size=64)),
    st.tuples(st.just("edit"), st.sampled_from(TUNER_NAMES), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("link"), st.sampled_from(TUNER_NAMES + FOREIGN_NAMES), st.sampled_from(LINK_TARGETS)),
    st.tuples(st.just("folder"), st.sampled_from(TUNER_NAMES + FOREIGN_NAMES), st.just(b"inside\n")),
    st.tuples(st.just("manifest"), st.sampled_from(TUNER_NAMES + FOREIGN_NAMES), st.sampled_from(MANIFESTS)))
cases = st.fixed_dictionaries({"base": st.sampled_from(BASES), "changes": st.lists(change, max_size=4),
                               "command": st.sampled_from(COMMANDS), "force": st.booleans()})
assert {kind for kind in CHANGES} == {"bytes", "edit", "link", "folder", "manifest"}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_no_command_changes_a_byte_tuner_did_not_write(case):
    """Whatever the folder holds and whichever command and flags run on it, every entry its manifest did not prove
    tuner's (and everything outside it that a link points at) is as it was, and the command ends in exit 0 or 2."""
    with tempfile.TemporaryDirectory() as root:
        outcome = run_case(case, Path(root))
    assert outcome["traceback"] is None, outcome["traceback"]
    assert outcome["lost"] == [] and outcome["exit"] in (0, 2), outcome


def test_a_resume_refuses_before_launch_a_merged_folder_it_could_not_replace_at_the_end(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, "render", "demo", "-o", run)[0] == 0
    (run / "merged").mkdir()
    (run / "merged" / "README.md").write_text("mine")
    code, err = cli(capsys, "run", "demo", "--set", f"output.dir={run}", "--resume", "--dry-run")
    assert code == 2 and err.startswith(f"error: {run / 'merged'}: holds files tuner did not write (README.md)"), err
    assert (run / "merged" / "README.md").read_text() == "mine"
