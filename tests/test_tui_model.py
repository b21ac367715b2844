"""The wizard's Model step: it finds the new families (a MoE model shows its experts and active parameters), shows
the layer kinds the planner sees, says which part of a model it cannot judge in the plan's own words, and shows the
hub's refusal or an unreachable hub in the words ``tuner plan`` prints (tests/hub_server.py answers for the hub)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from textual.widgets import Input, OptionList, Static

from hub_server import HubRepo, LocalHub
from tui_helpers import SIZE, in_tmp, make_app, pilot_test, settle, wait_until  # noqa: F401 (in_tmp: autouse)
from tuner.catalog.models import model_facts
from tuner.planner.items import CANNOT_JUDGE

pytestmark = pytest.mark.slow  # drives the wizard's model search against a local hub

# A tiny LFM2 (a short-convolution layer beside an attention layer): transformers builds it on the meta device, and
# the planner has no memory terms for its convolution or its feed-forward block.
LFM2 = {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "intermediate_size": 96,
        "layer_types": ["conv", "full_attention"]}


def facts_shown(app) -> str:
    return str(app.screen.query_one("#facts", Static).render())


def listed(app) -> list[str]:
    listing = app.screen.query_one("#model-list", OptionList)
    return [listing.get_option_at_index(i).id for i in range(listing.option_count)]


@pilot_test
async def test_a_moe_model_is_found_and_shows_its_experts_active_parameters_and_layer_kinds():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("model")
        await settle(pilot)
        search = app.screen.query_one("#model-search", Input)
        search.value = "moe"  # every MoE model says so in its summary, whatever its family is called
        await settle(pilot)
        found = listed(app)
        assert {"Qwen/Qwen3-30B-A3B", "openai/gpt-oss-20b", "deepseek-ai/DeepSeek-V3",
                "mistralai/Mixtral-8x7B-v0.1"} <= set(found)
        assert not any(model_facts(model_id).num_experts == 0 for model_id in found)
        search.value = "30b-a3b"
        await settle(pilot)
        search.focus()
        await pilot.press("enter")  # a single match is taken
        await wait_until(pilot, lambda: app.draft.value("model.id") == "Qwen/Qwen3-30B-A3B")
        await settle(pilot)
        facts = model_facts("Qwen/Qwen3-30B-A3B")
        shown = facts_shown(app)
        assert "experts          128" in shown and "experts / token  8" in shown
        assert f"active / total   {facts.active_params() / 1e9:.1f}B of {facts.total_params / 1e9:.1f}B" in shown
        assert "layer kinds\n48 x attention + MoE" in shown and CANNOT_JUDGE not in shown


@pilot_test
async def test_a_model_with_a_layer_kind_the_planner_cannot_judge_says_so_as_the_plan_does(tmp_path):
    model_dir = tmp_path / "lfm2"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LFM2))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("model")
        await settle(pilot)
        box = app.screen.query_one("#model-id-input", Input)
        box.focus()
        box.value = str(model_dir)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.draft.value("model.id") == str(model_dir), timeout=120)
        await settle(pilot)
        shown = facts_shown(app)
        assert app.plan is not None and app.plan.verdict == CANNOT_JUDGE and app.plan.unmodelled
        for part in app.plan.unmodelled:  # the plan's own list, one line each
            assert f"{CANNOT_JUDGE}: {part} — no memory terms, no fit verdict" in shown
        assert "conv (Lfm2ShortConv) (layers 0)" in shown
        app.switch_mode("method")
        await settle(pilot)
        assert CANNOT_JUDGE in str(app.screen.query_one("#verdict").render())


@pilot_test
async def test_an_image_text_model_shows_its_tower_projector_and_what_trains_and_the_plan_bar_its_parts(tmp_path):
    from image_text_configs import tiny_config
    from tuner.tui.widgets.plan_bar import plan_text

    model_dir = tmp_path / "qwen-vl"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(tiny_config("qwen2_5_vl")))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("model")
        await settle(pilot)
        box = app.screen.query_one("#model-id-input", Input)
        box.focus()
        box.value = str(model_dir)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.draft.value("model.id") == str(model_dir), timeout=120)
        await wait_until(pilot, lambda: app.plan is not None and app.plan.parts, timeout=120)
        await settle(pilot)
        shown = " ".join(facts_shown(app).split())
        parts = model_facts(str(model_dir)).inventory.parts
        assert "image-text parts" in shown
        assert f"vision tower model.visual ({parts['vision_tower']['module']}, {parts['vision_tower']['params']:,})" in shown
        assert f"projector model.visual.merger ({parts['projector']['module']}" in shown
        assert "trains language model (method.train); the other parts are loaded and frozen" in shown
        bar = " ".join(str(plan_text(app.plan, 100)).split())
        assert "weights by part: vision tower" in bar and "frozen · projector" in bar
        assert "language model" in bar and "trains" in bar
        assert app.plan.parts["vision_tower"]["trains"] is False and app.plan.parts["language_model"]["trains"]


HUB_SCRIPT = textwrap.dedent('''
    import asyncio, sys
    sys.path.insert(0, sys.argv[1])
    from textual.widgets import Input, Static
    from tui_helpers import make_app, settle, wait_until
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    async def main(model_id):
        app = make_app()
        async with app.run_test(size=(120, 36)) as pilot:
            app.switch_mode("model")
            await settle(pilot)
            search = app.screen.query_one("#model-search", Input)
            search.focus()
            await pilot.press(*model_id, "enter")
            await wait_until(pilot, lambda: app.draft.value("model.id") == model_id, timeout=120)
            await settle(pilot)
            try:
                model_facts(model_id)  # what `tuner plan` calls: its error is what the CLI prints
            except UnknownModelError as exc:
                print("CLI:", exc)
            print("SCREEN:", " ".join(str(app.screen.query_one("#facts", Static).render()).split()))
    for model_id in sys.argv[2:]:
        asyncio.run(main(model_id))
''')


def show_on_screen(env: dict[str, str], cwd: Path, *model_ids: str) -> list[tuple[str, str]]:
    """(the CLI's message, the facts panel) for each id typed in the search, in a process of its own (huggingface_hub
    reads HF_ENDPOINT once, when imported)."""
    shown = subprocess.run([sys.executable, "-c", HUB_SCRIPT, str(Path(__file__).parent), *model_ids],
                           capture_output=True, text=True, timeout=300, cwd=cwd, env={**os.environ, **env})
    assert shown.returncode == 0 and "Traceback" not in shown.stdout + shown.stderr, shown.stderr[-3000:]
    cli = [line[len("CLI: "):] for line in shown.stdout.splitlines() if line.startswith("CLI: ")]
    screen = [line[len("SCREEN: "):] for line in shown.stdout.splitlines() if line.startswith("SCREEN: ")]
    assert len(cli) == len(screen) == len(model_ids), shown.stdout
    return list(zip(cli, screen))


def test_a_hub_id_the_hub_refuses_or_cannot_be_reached_shows_the_clis_words(tmp_path, demo_model_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "TUNER_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    os.environ.pop("HF_TOKEN", None)
    with LocalHub({"org/gated": HubRepo.from_folder(demo_model_path, gated=True, token="hf_x")}) as hub:
        refused = show_on_screen({**env, "HF_ENDPOINT": hub.url}, tmp_path, "org/missing", "org/gated")
    unreachable = show_on_screen({**env, "HF_ENDPOINT": "http://127.0.0.1:9"}, tmp_path, "org/demo")
    expected = [f"fetching org/missing's config.json (revision main) from {hub.url}: org/missing: no such model on",
                f"fetching org/gated's config.json (revision main) from {hub.url}: org/gated is gated",
                "fetching org/demo's config.json (revision main) from http://127.0.0.1:9: cannot reach"]
    for (cli, screen), start in zip(refused + unreachable, expected):
        assert cli.startswith(start), cli
        assert " ".join(cli.split()) in screen, (cli, screen)
