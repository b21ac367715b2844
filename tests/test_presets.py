"""The shipped ``accelerate_configs/`` are exactly what the renderer writes today, and Accelerate accepts each;
``tuner presets cp`` gives an installed tuner's users the same files wherever they want them."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import REPO
from tuner.render.presets import PRESETS, PRESETS_DIR, render_presets
from tuner.rundir.layout import MANIFEST
from tuner.rundir.manifest import proved


def test_shipped_presets_equal_the_renderer_output():
    shipped = {path.name: path.read_text() for path in (REPO / PRESETS_DIR).iterdir() if path.name != MANIFEST}
    assert shipped == render_presets(), "presets drifted: run `tuner presets cp accelerate_configs --force` and commit the result"
    assert sorted(proved(REPO / PRESETS_DIR)) == sorted(shipped), "its manifest proves each of them tuner's"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_accelerate_launch_accepts_each_preset_from_the_repository_root(name, monkeypatch):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    monkeypatch.chdir(REPO)
    for key in list(os.environ):
        if key.startswith(("ACCELERATE_", "FSDP_")):
            monkeypatch.delenv(key)
    config_file = f"{PRESETS_DIR}/{name}.yaml"
    assert (REPO / config_file).read_text().startswith("# ")  # says when to use it
    config = load_config_from_file(config_file)
    args, _, _ = _validate_launch_command(
        launch_command_parser().parse_args(["--config_file", config_file, "train.py"]))
    assert args.use_deepspeed == (config.distributed_type.value == "DEEPSPEED")
    if args.use_deepspeed:
        deepspeed_file = config.deepspeed_config["deepspeed_config_file"]
        assert json.loads((REPO / deepspeed_file).read_text())["zero_optimization"]["stage"] in (1, 2, 3)


def test_presets_cp_writes_every_preset_where_asked_and_keeps_what_is_there(tmp_path, tuner_cli):
    from accelerate.commands.config.config_args import load_config_from_file

    dest = tmp_path / "my presets"
    written = tuner_cli("presets", "cp", str(dest), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert {path.name: path.read_text() for path in dest.iterdir() if path.name != MANIFEST} == render_presets(str(dest))
    zero3 = load_config_from_file(str(dest / "zero3.yaml"))
    assert json.loads(Path(zero3.deepspeed_config["deepspeed_config_file"]).read_text())["zero_optimization"]["stage"] == 3

    refused = tuner_cli("presets", "cp", str(dest), cwd=tmp_path)
    assert refused.returncode == 2 and "--force" in refused.stderr
    (dest / "notes.md").write_text("mine")  # beside the presets: never touched
    assert tuner_cli("presets", "cp", str(dest), "--force", cwd=tmp_path).returncode == 0  # its own files: replaced
    (dest / "ddp.yaml").write_text("# mine\n")  # a preset the user edited is the user's
    for force in ((), ("--force",)):
        refused = tuner_cli("presets", "cp", str(dest), *force, cwd=tmp_path)
        assert refused.returncode == 2 and "ddp.yaml" in refused.stderr and "Traceback" not in refused.stderr
        assert (dest / "ddp.yaml").read_text() == "# mine\n"
    (dest / "ddp.yaml").unlink()
    assert tuner_cli("presets", "cp", str(dest), "--force", cwd=tmp_path).returncode == 0
    assert (dest / "ddp.yaml").read_text() == render_presets(str(dest))["ddp.yaml"]
    assert (dest / "notes.md").read_text() == "mine"
