"""The shipped ``accelerate_configs/`` are exactly what the renderer writes today, and Accelerate accepts each;
``tuner presets cp`` gives an installed tuner's users the same files wherever they want them."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import REPO
from tuner.render.presets import PRESETS, PRESETS_DIR, render_presets


def test_shipped_presets_equal_the_renderer_output():
    shipped = {path.name: path.read_text() for path in (REPO / PRESETS_DIR).iterdir()}
    assert shipped == render_presets(), "presets drifted: run `tuner presets cp accelerate_configs --force` and commit the result"


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
    assert {path.name: path.read_text() for path in dest.iterdir()} == render_presets(str(dest))
    zero3 = load_config_from_file(str(dest / "zero3.yaml"))
    assert json.loads(Path(zero3.deepspeed_config["deepspeed_config_file"]).read_text())["zero_optimization"]["stage"] == 3

    (dest / "ddp.yaml").write_text("# mine\n")
    refused = tuner_cli("presets", "cp", str(dest), cwd=tmp_path)
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert (dest / "ddp.yaml").read_text() == "# mine\n"
    assert tuner_cli("presets", "cp", str(dest), "--force", cwd=tmp_path).returncode == 0
    assert (dest / "ddp.yaml").read_text() == render_presets(str(dest))["ddp.yaml"]
