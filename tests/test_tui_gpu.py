"""On a machine with NVIDIA GPUs: the Hardware screen finds them and prefills a new recipe."""
from __future__ import annotations

import shutil

import pytest

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (nvidia-smi)")


def test_hardware_screen_prefills_this_machines_gpus(tmp_path, monkeypatch):
    from tui_helpers import SIZE, pilot_test, settle
    from tuner.tui.app import TunerApp
    from tuner.tui.detect import detect_gpus

    monkeypatch.chdir(tmp_path)
    found = detect_gpus()
    assert found is not None and found.count >= 1 and found.memory_gib > 1

    @pilot_test
    async def scenario():
        app = TunerApp()
        async with app.run_test(size=SIZE) as pilot:
            app.switch_mode("hardware")
            await settle(pilot)
            assert found.name in str(app.screen.query_one("#detected").render())
            assert app.draft.value("hardware.gpus_per_machine") == found.count
            assert app.draft.value("hardware.gpu") == (found.catalog_name() or f"{found.memory_gib:.0f}GB")
            assert app.draft.valid and app.plan is not None and app.plan.devices[0].kind == "gpu"

    scenario()
