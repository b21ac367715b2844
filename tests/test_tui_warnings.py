"""The TUI's Review screen shows the same recipe warnings as the CLI (trust_remote_code names the model)."""
from __future__ import annotations

from textual.widgets import Static
from tui_helpers import SIZE, demo_draft, make_app, pilot_test, settle


@pilot_test
async def test_review_warns_about_remote_code_naming_the_model(tmp_path, monkeypatch, demo_model_path):
    monkeypatch.chdir(tmp_path)
    app = make_app(demo_draft({"model.trust_remote_code": True}))
    async with app.run_test(size=SIZE) as pilot:
        app.switch_mode("review")
        await settle(pilot)
        shown = str(app.screen.query_one("#command", Static).render())
        assert shown.startswith("warning: model.trust_remote_code: the Python code shipped with 'builtin:demo'")
        assert "$ accelerate launch" in shown
