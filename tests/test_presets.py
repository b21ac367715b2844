"""The shipped ``accelerate_configs/`` are exactly what the renderer writes today, and Accelerate accepts each."""
from __future__ import annotations

import json
import os

import pytest

from conftest import REPO
from tuner.render.presets import PRESETS, PRESETS_DIR, render_presets


def test_shipped_presets_equal_the_renderer_output():
    shipped = {path.name: path.read_text() for path in (REPO / PRESETS_DIR).iterdir()}
    assert shipped == render_presets(), "presets drifted: run `python -m tuner.render.presets` and commit the result"


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
