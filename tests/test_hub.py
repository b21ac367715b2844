"""A hub model by name, against a real HTTP server that answers the hub's endpoints (tests/hub_server.py) for the
built-in demo model's files: ``tuner plan`` fetches only its config.json (and safetensors index) once and keeps it;
``tuner run`` downloads the model once, with a progress bar, before any rank starts, and the ranks load it from the
cache; a download that cannot fit is refused before its first byte; a missing, gated, private or unreachable model
is an environment error (exit 1) in the hub's words."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_tuner

from hub_server import HubRepo, LocalHub

pytestmark = pytest.mark.slow  # round trips to a local hub server in real processes

TOKEN = "hf_granted_token"
QUICK = ["--set", "training.max_steps=3", "--set", "data.max_samples=200", "--set", "data.eval_fraction=0",
         "--set", "training.max_seq_length=24", "--set", "training.logging_steps=1"]
MXFP4_CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 128, "vocab_size": 100, "dtype": "bfloat16",
                "quantization_config": {"quant_method": "mxfp4"}}
SHARDS = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]


def _bamba() -> HubRepo:
    """A Mamba-2 hybrid's config.json as transformers saves it: time_step_limit's inf as {"__float__": "Infinity"}."""
    import tempfile

    from benchmarks.causal_lm_sweep import cut_config

    with tempfile.TemporaryDirectory() as folder:
        cut_config("bamba").save_pretrained(folder)
        return HubRepo({"config.json": (Path(folder) / "config.json").read_bytes()})


@pytest.fixture(scope="module")
def hub(demo_model_path):
    index = {"metadata": {"total_size": 13_761_300_000, "total_parameters": 20_914_757_184},
             "weight_map": {f"model.layers.{n}.mlp.experts.gate_up_proj_blocks": SHARDS[n % 3] for n in range(6)}}
    sharded = HubRepo({"config.json": json.dumps(MXFP4_CONFIG).encode(),
                       "model.safetensors.index.json": json.dumps(index).encode(),
                       **{name: b"\0" * 64 for name in SHARDS}})
    repos = {"org/demo": HubRepo.from_folder(demo_model_path), "org/sharded": sharded, "org/bamba": _bamba(),
             "org/gated": HubRepo.from_folder(demo_model_path, gated=True, token=TOKEN),
             "org/private": HubRepo.from_folder(demo_model_path, private=True, token=TOKEN)}
    with LocalHub(repos) as server:
        yield server


@pytest.fixture(autouse=True)
def no_token(monkeypatch):
    """A developer's own HF_TOKEN would change the hub's answers (and is nothing a test may send anywhere)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)


def hub_env(hub: LocalHub, home: Path, **extra: str) -> dict[str, str]:
    """One machine's settings: the local hub, its own Hugging Face cache and tuner home, no token unless given."""
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(home / "hf"), "TUNER_HOME": str(home / "tuner-home"),
            "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


def test_plan_fetches_only_the_config_of_a_hub_model_once_then_plans_from_what_it_kept(hub, tmp_path):
    hub.requests.clear()
    env = hub_env(hub, tmp_path)
    first = run_tuner("plan", "--model", "org/demo", "--method", "lora", env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "architecture: the hub's config.json" in first.stdout and "fetched now from" in first.stdout
    assert hub.downloads() == ["config.json"]  # the weights' size came from a HEAD request, not a download
    assert ("HEAD", "/org/demo/resolve/" + hub.repos["org/demo"].commit + "/model.safetensors") in hub.requests

    hub.requests.clear()
    again = run_tuner("plan", "--model", "org/demo", env=env, cwd=tmp_path)
    assert again.returncode == 0 and "kept by tuner" in again.stdout, again.stdout + again.stderr
    assert hub.requests == []

    offline = {**env, "TUNER_HOME": str(tmp_path / "other-home"), "HF_HUB_OFFLINE": "1"}
    cached = run_tuner("plan", "--model", "org/demo", env=offline, cwd=tmp_path)
    assert cached.returncode == 0 and "the Hugging Face cache's config.json" in cached.stdout, cached.stderr
    unknown = run_tuner("plan", "--model", "org/never-fetched", env=offline, cwd=tmp_path)
    assert unknown.returncode == 2 and "HF_HUB_OFFLINE is set so the hub was not asked" in unknown.stderr
    assert hub.requests == []


def test_a_hub_config_is_read_as_transformers_reads_it_fetched_and_kept(hub, tmp_path):
    """The hub's config.json and tuner's kept copy of it both give transformers' decoded time_step_limit (inf)."""
    assert b'"__float__": "Infinity"' in hub.repos["org/bamba"].files["config.json"]
    env = hub_env(hub, tmp_path)
    for _ in range(2):  # fetched from the hub, then read from what tuner kept
        result = run_tuner("plan", "--model", "org/bamba", "--gpus", "1x80GB", "--method", "full", "--json", env=env,
                           cwd=tmp_path)
        assert result.returncode == 1, result.stderr  # no verdict: exit 1, as for a plan that does not fit
        data = json.loads(result.stdout)
        assert data["verdict"] == "cannot judge" and data["params"]["total"] == 2_166_603_264
        assert any("a Mamba-2 mixer: not modelled" in part for part in data["unmodelled"])
    kept = run_tuner("plan", "--model", "org/bamba", "--gpus", "1x80GB", env=env, cwd=tmp_path)
    assert "kept by tuner" in kept.stdout, kept.stdout + kept.stderr


def test_plan_tells_the_size_and_dtype_a_hub_model_ships_in_from_its_safetensors_index(hub, tmp_path):
    hub.requests.clear()
    planned = run_tuner("plan", "--model", "org/sharded", env=hub_env(hub, tmp_path), cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert "ships 13.8 GB of safetensors in 3 files, bfloat16 mxfp4-quantised" in " ".join(planned.stdout.split())
    assert sorted(hub.downloads()) == ["config.json", "model.safetensors.index.json"]


@pytest.mark.parametrize("model, token, said", [
    ("org/missing", None, "org/missing: no such model on"),  # the hub answers 401 to a missing repo without a token
    ("org/missing", TOKEN, "(the hub answered 404: Repository not found)"),
    ("org/gated", None, "org/gated is gated (the hub answered 401: Access to model org/gated is restricted"),
    ("org/private", None, "or a private one this token cannot see"),
], ids=["missing", "missing-with-token", "gated", "private"])
def test_a_hub_model_the_hub_refuses_is_an_environment_error_in_its_words(hub, tmp_path, model, token, said):
    env = hub_env(hub, tmp_path, **({"HF_TOKEN": token} if token else {}))
    planned = run_tuner("plan", "--model", model, env=env, cwd=tmp_path)
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert planned.stderr.startswith(f"error: fetching {model}'s config.json (revision main) from {hub.url}: ")
    assert said in planned.stderr and "Traceback" not in planned.stderr
    ran = run_tuner("run", "demo", "--set", f"model.id={model}", env=env, cwd=tmp_path)
    assert ran.returncode == 1 and said in ran.stderr and not (tmp_path / "runs").exists()


def test_a_private_hub_model_is_read_with_hf_token(hub, tmp_path):
    planned = run_tuner("plan", "--model", "org/private", env=hub_env(hub, tmp_path, HF_TOKEN=TOKEN), cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr


def test_an_unreachable_hub_is_named_with_what_was_tried_at_once(hub, tmp_path):
    unreachable = {**hub_env(hub, tmp_path), "HF_ENDPOINT": "http://127.0.0.1:9"}  # the discard port: refused
    planned = run_tuner("plan", "--model", "org/demo", env=unreachable, cwd=tmp_path)
    assert planned.returncode == 1
    assert ("error: fetching org/demo's config.json (revision main) from http://127.0.0.1:9: cannot reach "
            "http://127.0.0.1:9") in planned.stderr and "HF_HUB_OFFLINE=1" in planned.stderr
    assert "Retrying" not in planned.stderr  # one attempt, not half a minute of huggingface_hub's retries


def test_a_run_of_a_hub_model_downloads_it_once_before_the_ranks_which_load_it_from_the_cache(hub, tmp_path):
    hub.requests.clear()
    env = hub_env(hub, tmp_path)
    commit = hub.repos["org/demo"].commit
    first = run_tuner("run", "demo", "--set", "model.id=org/demo", *QUICK, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert f"downloading org/demo (commit {commit[:12]}): 5 of 6 files, 3.0 MB, into {tmp_path}/hf/hub" in first.stderr
    assert "org/demo: 100%" in first.stderr and "B/s]" in first.stderr  # tqdm's bar: size and rate
    assert sorted(hub.downloads()) == sorted(hub.repos["org/demo"].files)  # every file once (config.json by plan)
    run_dir = tmp_path / "runs" / "demo"
    record = json.loads((run_dir / "model_snapshot.json").read_text())
    assert record["commit"] == commit and set(record["files"]) == set(hub.repos["org/demo"].files)
    # after the download's one look at the branch, nothing asked the hub about it: not the ranks, not the report
    looked = hub.requests.index(("GET", "/api/models/org/demo/revision/main"))
    assert [path for _, path in hub.requests[looked + 1:] if "/main/" in path] == []

    hub.requests.clear()
    second = run_tuner("run", "demo", "--set", "model.id=org/demo", *QUICK, "--force", env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"model: org/demo (commit {commit[:12]}), all 6 files already in the Hugging Face cache" in second.stderr
    assert hub.downloads() == [] and [path for _, path in hub.requests if "/resolve/" in path] == []

    hub.requests.clear()
    answered = run_tuner("infer", "--model", "org/demo", "--prompt", "abc", "--max-new-tokens", "4", env=env,
                         cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr[-3000:]
    assert "all 6 files already in the Hugging Face cache" in answered.stderr and hub.downloads() == []


def test_a_dry_run_says_what_it_would_download_and_downloads_nothing(hub, tmp_path):
    hub.requests.clear()
    ran = run_tuner("run", "demo", "--set", "model.id=org/demo", "--dry-run", env=hub_env(hub, tmp_path), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "on launch: downloading org/demo" in ran.stderr and "5 of 6 files, 3.0 MB" in ran.stderr
    assert hub.downloads() == ["config.json"] and not (tmp_path / "runs" / "demo" / "model_snapshot.json").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs: smaller than the demo model's 3.0 MB of files."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_download_the_disk_cannot_hold_is_refused_before_its_first_byte(hub, tmp_path, small_disk):
    hub.requests.clear()
    env = {**hub_env(hub, tmp_path), "HF_HOME": str(small_disk)}
    ran = run_tuner("run", "demo", "--set", "model.id=org/demo", env=env, cwd=tmp_path)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert f"model download {small_disk}/hub: " in ran.stderr and "the download of org/demo needs 3.0 MB" in ran.stderr
    assert "HF_HOME or HF_HUB_CACHE" in ran.stderr
    answered = run_tuner("infer", "--model", "org/demo", "--prompt", "abc", env=env, cwd=tmp_path)
    assert answered.returncode == 1 and "refused" in answered.stderr and "needs 3.0 MB" in answered.stderr
    assert hub.downloads() == ["config.json"]  # the plan's 714 bytes; not one byte of the weights


def test_each_machine_downloads_the_recorded_commit_before_its_rendezvous(hub, tmp_path):
    """Two machines with their own caches: ``tuner run`` records the commit without downloading; each machine's
    preflight (what launch.sh N runs before the rendezvous) downloads that commit into its own cache."""
    hub.requests.clear()
    machines = ["--set", "hardware.machines=2", "--set", "memory.distributed=ddp",
                "--set", "hardware.main_process_ip=127.0.0.1"]
    ran = run_tuner("run", "demo", "--set", "model.id=org/demo", *machines, env=hub_env(hub, tmp_path / "m0"),
                    cwd=tmp_path)
    assert ran.returncode == 2 and "launch.sh" in ran.stderr, ran.stdout + ran.stderr  # a run on 2 machines starts on each
    assert "is downloaded on each machine by its launch.sh before the rendezvous" in ran.stderr
    assert hub.downloads() == ["config.json"]
    lock = tmp_path / "runs" / "demo" / "recipe.lock.yaml"
    assert "doctor --preflight" in (lock.parent / "launch.sh").read_text()
    for rank in (0, 1):
        hub.requests.clear()
        machine = hub_env(hub, tmp_path / f"m{rank}")
        checked = run_tuner("doctor", "--preflight", "--machine-rank", str(rank), str(lock), env=machine, cwd=tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "model files" in checked.stdout and "all 6 files in this machine's Hugging Face cache" in checked.stdout
        assert len(hub.downloads()) == (5 if rank == 0 else 6)  # machine 0 holds config.json from its plan


def test_the_wizard_model_search_fetches_a_hub_id_nothing_lists(hub, tmp_path):
    """Enter on ``org/name`` in the Model screen's search: its config.json is fetched, its facts shown."""
    script = textwrap.dedent('''
        import asyncio, sys
        sys.path.insert(0, sys.argv[1])
        from textual.widgets import Input, Static
        from tui_helpers import make_app, settle, wait_until

        async def main():
            app = make_app()
            async with app.run_test(size=(120, 36)) as pilot:
                await pilot.press("enter")  # New recipe: the Model screen
                search = app.screen.query_one("#model-search", Input)
                search.focus()
                await pilot.press(*"org/demo", "enter")
                await wait_until(pilot, lambda: app.draft.value("model.id") == "org/demo", timeout=120)
                await settle(pilot)
                print(app.screen.query_one("#facts", Static).render())
        asyncio.run(main())
    ''')
    shown = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path, env={**os.environ, **hub_env(hub, tmp_path)})
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "fetched now from" in shown.stdout and "hidden size" in shown.stdout, shown.stdout
    assert "config.json" in hub.downloads()
