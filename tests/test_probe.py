"""``tuner probe``: the recipe's own world for a few steps on worst-case batches, measured beside the plan.

The slow tests launch real ranks on this CPU (one process, and two gloo ranks with DDP, ZeRO-2 and ZeRO-3); one of
them runs a rank out of memory for real, under an address-space limit set on that rank alone, and one stops the
probe with a signal.  The rest check the pieces without launching: the probe's recipe and files, the worst-case
samples, the comparison with the plan (on GPU-shaped measurements too), the record ``tuner plan`` shows and the
micro-batch candidates.
"""
from __future__ import annotations

import json
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, process_running
from test_cpu_ranks import free_port

from tuner.launch.batch_tuning import batch_candidates, effective_per_rank
from tuner.launch.probe import failure_line, probe_recipe, _failure
from tuner.planner.measured import MeasuredRecord, measured_record, save_record
from tuner.launch.probe_report import group_rows, phase_rows, probe_peak
from tuner.planner import plan
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_path
from tuner.rundir.events import Event, parse_event
from tuner.render.run_directory import holds_only_rendered_files, render_run_files, write_run_directory

SMALL = ["data.max_samples=200", "training.max_steps=2"]


def sets(*assignments: str) -> list[str]:
    return [arg for assignment in assignments for arg in ("--set", assignment)]


def two_ranks(name: str, *tactic: str) -> list[str]:
    return sets(f"name={name}", "hardware.num_processes=2", f"hardware.main_process_port={free_port()}",
                "training.micro_batch_size=8", "training.max_seq_length=48", *SMALL, *tactic)


# ---------------------------------------------------------------- without launching

def test_the_probe_launches_the_files_tuner_run_renders(tmp_path):
    recipe = load_recipe(builtin_path("demo"), ["hardware.num_processes=2", "memory.distributed=deepspeed",
                                                "memory.zero_stage=3", f"output.dir={tmp_path / 'run'}"])
    probe = probe_recipe(recipe, steps=3)
    assert probe.output.dir == str(tmp_path / "run" / "probe")
    assert (probe.training.max_steps, probe.training.save_steps, probe.training.eval_steps) == (3, 3, 3)
    assert probe.memory == recipe.memory and probe.hardware == recipe.hardware and probe.method == recipe.method
    run_files, probe_files = render_run_files(recipe), render_run_files(probe)
    for name in ("accelerate.yaml", "deepspeed.json", "launch.sh"):
        assert probe_files[name].replace(probe.output.dir, recipe.output.dir) == run_files[name], name


def test_a_probes_leftovers_do_not_stop_the_run_it_was_for(tmp_path):
    run = tmp_path / "run"
    write_run_directory(probe_recipe(load_recipe(builtin_path("demo"), [f"output.dir={run}"])))
    for name in ("events.jsonl", "train.log", "probe.json", "probe_request.json"):
        (run / "probe" / name).write_text("x")
    assert holds_only_rendered_files(run) and holds_only_rendered_files(run / "probe")
    (run / "probe" / "launch.sh").write_text("mine")  # no longer the file tuner rendered: not replaced unasked
    assert not holds_only_rendered_files(run / "probe")
    (run / "probe" / "launch.sh").unlink()
    (run / "events.jsonl").write_text("{}")  # a run started here: no longer replaced without asking
    assert not holds_only_rendered_files(run)
    (run / "probe" / "probe_request.json").unlink()  # not a probe's folder: its events are a run's
    assert not holds_only_rendered_files(run / "probe")


def test_worst_case_samples_are_max_seq_length_long_and_made_of_the_longest_samples():
    from datasets import Dataset

    from tuner.train.probe import worst_case_samples

    lengths = [3, 19, 5, 7, 2, 18, 4, 6, 3, 2, 17, 8, 16, 1, 2, 15, 14, 13, 3, 1]
    rows = {"input_ids": [[n] * n for n in lengths], "labels": [[-100] + [n] * (n - 1) for n in lengths]}
    made = worst_case_samples(Dataset.from_dict(rows), count=2, max_length=40)
    assert len(made) == 2 and all(len(ids) == 40 for ids in made["input_ids"])
    assert made["input_ids"][0][:37] == [19] * 19 + [18] * 18  # the longest first, laid end to end
    assert made["labels"][0][:2] == [-100, 19] and made["labels"][0][19:21] == [-100, 18]  # their own loss masks
    assert set(made["input_ids"][1]) <= {19, 18, 17, 16, 15, 14, 13, 8}  # only the longest samples are used
    chosen = worst_case_samples(Dataset.from_dict(rows).select([0, 2, 4, 6]), count=1, max_length=12)
    assert chosen["input_ids"][0] == [5] * 5 + [4] * 4 + [3] * 3  # a selection's own samples, not its table's


def gpu_events(world: int = 1) -> list[Event]:
    """What the ranks of a GPU probe write (shapes of tuner.train.probe's events, values made up)."""
    events = []
    for rank in range(world):
        common = {"event": "probe", "rank": rank, "device": "NVIDIA H200", "capacity_gib": 139.8, "peak_rss_gib": 3.0}
        events += [
            {**common, "phase": "loading", "peak_allocated_gib": 15.0, "peak_reserved_gib": 15.5, "device_gib": 16.3,
             "outside_allocator_gib": 0.8, "current_gib": 15.0},
            {**common, "phase": "training step", "peak_allocated_gib": 40.0, "peak_reserved_gib": 44.0,
             "device_gib": 44.8 + rank, "outside_allocator_gib": 0.8, "between_steps_gib": 16.0, "tokens_per_s": 5000.0,
             "seconds_per_step": 0.8, "timed_steps": 2},
            {**common, "phase": "evaluation", "peak_allocated_gib": 20.0, "peak_reserved_gib": 44.0, "device_gib": 44.8,
             "outside_allocator_gib": 0.8},
            {**common, "phase": "saving", "peak_allocated_gib": 16.0, "peak_reserved_gib": 44.0, "device_gib": 44.8,
             "outside_allocator_gib": 0.8},
        ]
    return [parse_event(event) for event in events]


def test_gpu_measurements_are_compared_at_torchs_three_levels_and_by_term_group():
    from tuner.launch.probe_report import by_rank_and_phase

    recipe = load_recipe(builtin_path("llama3.1/8b-lora"))
    memory_plan = plan(recipe)
    measured = by_rank_and_phase(gpu_events())
    rows = {(row.what, row.level): row for row in phase_rows(measured, memory_plan, recipe.world_size)}
    device = memory_plan.gpu
    step = rows[("training step", "allocated")]
    assert step.measured_gib == 40.0
    assert step.planned_gib == pytest.approx(device.phase_gib("training step", ("allocated",)))
    assert rows[("training step", "device")].planned_gib == pytest.approx(device.phase_gib("training step"))
    assert rows[("training step", "device")].error == pytest.approx(44.8 / device.phase_gib("training step") - 1)
    assert rows[("loading", "allocated")].planned_gib is None  # loading happens in host RAM in the plan
    groups = {row.what.split(" (")[0]: row for row in group_rows(measured, memory_plan, recipe.world_size)}
    assert groups["model states"].measured_gib == 16.0
    assert groups["step transients"].measured_gib == pytest.approx(24.0)
    assert groups["allocator cache"].measured_gib == pytest.approx(4.0)
    assert groups["outside the allocator"].planned_gib == pytest.approx(0.75)  # the CUDA context, measured once
    planned_states = sum(i.bytes for i in device.items if i.phase == "always" and i.level == "allocated") / 2**30
    assert groups["model states"].planned_gib == pytest.approx(planned_states)


def test_the_peak_is_the_busiest_gpu_or_every_cpu_process_together():
    from tuner.launch.probe_report import by_rank_and_phase

    gpu_recipe = load_recipe(builtin_path("llama3.1/8b-lora"))
    peak = probe_peak(by_rank_and_phase(gpu_events(world=2)), plan(gpu_recipe))
    assert (peak.measured_gib, peak.rank, peak.phase) == (45.8, 1, "training step")
    cpu_events = [parse_event({"event": "probe", "rank": rank, "phase": phase, "peak_rss_gib": value,
                               "capacity_gib": 16.0})
                  for rank in (0, 1) for phase, value in (("loading", 0.5), ("training step", 0.7 + rank / 10))]
    cpu_recipe = load_recipe(builtin_path("demo"), ["hardware.num_processes=2", "memory.distributed=ddp"])
    peak = probe_peak(by_rank_and_phase(cpu_events), plan(cpu_recipe))
    assert (peak.measured_gib, peak.rank, peak.phase) == (1.5, None, "training step")
    assert peak.planned_gib == pytest.approx(plan(cpu_recipe).gpu.total_gib)  # the plan of both processes


def test_a_failed_rank_is_named_with_its_phase_and_batch(tmp_path):
    events = [parse_event(event) for event in [
        {"event": "probe_phase", "rank": 1, "phase": "loading", "batch": None},
        {"event": "probe_phase", "rank": 1, "phase": "training step",
         "batch": {"samples": 64, "tokens_per_sample": 256, "packed": False, "text": "64 x 256 tokens"}},
        {"event": "probe_phase", "rank": 0, "phase": "training step", "batch": None},
        {"event": "error", "rank": 1, "kind": "out_of_memory", "message": "out of memory. Next step ...", "time": 1.0},
    ]]
    failure = _failure(events, tmp_path / "train.log", [])
    assert failure_line(failure) == "rank 1 ran out of memory during the training step on a batch of 64 x 256 tokens"
    events[-1] = parse_event({"event": "error", "rank": 1, "message": "ValueError: bad batch", "time": 1.0})
    assert failure_line(_failure(events, tmp_path / "train.log", [])).endswith("tokens: ValueError: bad batch")


def test_a_record_is_shown_by_plan_for_the_same_setup_only(tmp_path, tuner_cli, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TUNER_HOME", str(home))
    recipe = load_recipe(builtin_path("demo"))
    assert measured_record(recipe) is None
    save_record(recipe, MeasuredRecord("2026-12-01", 0.77, 1.10, "peak resident set of the process", "probe.json"))
    assert measured_record(recipe).measured_gib == 0.77
    assert measured_record(load_recipe(builtin_path("demo"), ["training.micro_batch_size=4"])) is None
    assert measured_record(load_recipe(builtin_path("demo"), ["training.max_steps=9"])) is not None  # not a tactic
    shown = tuner_cli("plan", "demo", env={"TUNER_HOME": str(home)}, cwd=tmp_path)
    planned = plan(recipe).gpu.total_gib
    shown_line = " ".join(shown.stdout.split())  # as one line, whatever the terminal's width wrapped
    assert f"measured on this machine on 2026-12-01: 0.77 GiB (plan {planned:.2f} GiB)" in shown_line
    assert "verdict: fits" in shown.stdout  # beside the plan, not instead of it
    other = tuner_cli("plan", "demo", "--set", "training.micro_batch_size=4", env={"TUNER_HOME": str(home)}, cwd=tmp_path)
    assert "measured on this machine" not in other.stdout


def test_micro_batch_candidates_divide_the_effective_batch_and_follow_the_plan(tmp_path):
    recipe = load_recipe(builtin_path("demo"), ["training.micro_batch_size=8", "training.gradient_accumulation_steps=2",
                                                "training.max_seq_length=256", "hardware.host_ram_gb=1.25"])
    candidates = batch_candidates(recipe, margin=0.1)
    assert [c.micro_batch_size for c in candidates] == [16, 8, 4, 2, 1]  # every divisor, largest first
    assert all(c.micro_batch_size * c.accumulation == effective_per_rank(recipe) == 16 for c in candidates)
    for candidate in candidates:  # the plan decides which are launched: under 1.25 GiB less 10%
        over = plan(candidate.recipe).gpu.total_gib > 1.25 * 0.9
        assert (candidate.verdict == "plan: over the margin") == over
    assert candidates[0].verdict == "plan: over the margin" and candidates[-1].verdict == "not probed"


def test_tune_batch_refuses_an_existing_destination_before_launching(tmp_path, tuner_cli):
    (tmp_path / "mine.yaml").write_text(builtin_path("demo").read_text())
    (tmp_path / "mine.tuned.yaml").write_text("mine\n")
    result = tuner_cli("probe", "mine.yaml", "--tune-batch", "--write", cwd=tmp_path)
    assert result.returncode == 2 and "mine.tuned.yaml exists; tuner never replaces it" in result.stderr
    assert (tmp_path / "mine.tuned.yaml").read_text() == "mine\n" and not (tmp_path / "runs").exists()
    alone = tuner_cli("probe", "mine.yaml", "--write", "x.yaml", cwd=tmp_path)
    assert alone.returncode == 2 and "go with --tune-batch" in alone.stderr


# ---------------------------------------------------------------- real launches

@pytest.fixture
def probe_home(tmp_path, demo_model_path, monkeypatch) -> Path:
    """A tuner home of the test's own (the records a probe keeps stay out of the other tests' plans), holding the
    session's built demo model."""
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / "demo").symlink_to(demo_model_path, target_is_directory=True)
    monkeypatch.setenv("TUNER_HOME", str(home))
    return home


def probe_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "probe" / "probe.json").read_text())


def rank_pids(report: dict) -> set[int]:
    return {event["pid"] for phases in report["ranks"].values() for event in phases.values()}


@pytest.mark.slow
def test_run_with_probe_measures_beside_the_plan_then_trains_and_plan_shows_it(tmp_path, tuner_cli, probe_home):
    """One process: the demo probed (measured vs planned per phase and term group), then trained as usual; probe.json
    and the record under $TUNER_HOME are left, and `tuner plan` of the same setup shows the measurement."""
    overrides = sets("data.max_samples=200", "training.max_steps=1", "training.micro_batch_size=16")
    result = tuner_cli("run", "demo", "--probe", *overrides, cwd=tmp_path, timeout=600)
    run_dir = tmp_path / "runs" / "demo"
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for phase in ("loading", "training step", "evaluation", "saving"):
        assert f"\n{phase} " in out, out
    assert "model states (weights, optimizer)" in out and "step transients" in out and "tokens/s" in out
    step_line = next(line for line in out.splitlines() if line.startswith("training step"))
    measured, planned, error = step_line.split()[-3:]
    assert float(planned) == pytest.approx(plan(load_recipe(builtin_path("demo"), overrides[1::2])).gpu.phase_gib(
        "training step"), abs=1e-3)
    report = probe_json(run_dir)
    step_row = next(row for row in report["phases"] if row["what"] == "training step")
    assert float(measured) == pytest.approx(step_row["measured_gib"], abs=1e-3)
    # the error is of the unrounded numbers (the printed ones are rounded to 3 places): the same as probe.json's
    assert error == f"{(step_row['measured_gib'] - step_row['planned_gib']) / step_row['planned_gib']:+.0%}"
    assert report["status"] == "measured" and list(report["ranks"]) == ["0"]
    assert set(report["ranks"]["0"]) == {"loading", "training step", "evaluation", "saving"}
    assert report["versions"]["torch"] and report["devices"]["0"] and report["speed"]["tokens_per_s"] > 0
    assert report["batch"] == {"micro_batch_size": 16, "gradient_accumulation_steps": 1, "tokens_per_sample": 64,
                               "packed": False}
    assert not (run_dir / "probe" / "checkpoints").exists()  # measured, then removed
    assert (run_dir / "final").is_dir()  # the run itself followed the probe
    assert not any(process_running(pid) for pid in rank_pids(report))
    shown = tuner_cli("plan", "demo", *overrides, cwd=tmp_path)
    line = " ".join(shown.stdout.split())
    assert f"measured on this machine on {time.strftime('%Y-%m-%d')}: {report['peak']['measured_gib']:.2f} GiB" in line


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
@pytest.mark.parametrize("name, tactic", [  # ZeRO-3, the world with the most per-rank state (DDP and ZeRO-2 probe
    ("zero3", ["memory.distributed=deepspeed", "memory.zero_stage=3"]),  # through the same code, each cost a minute)
])
def test_two_gloo_ranks_are_each_measured_per_phase(name, tactic, tmp_path, tuner_cli, probe_home):
    result = tuner_cli("probe", "demo", *two_ranks(name, *tactic), cwd=tmp_path, timeout=400,
                       env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")})
    run_dir = tmp_path / "runs" / name
    assert result.returncode == 0, result.stderr[-3000:] + (run_dir / "probe" / "train.log").read_text()[-3000:]
    report = probe_json(run_dir)
    assert sorted(report["ranks"]) == ["0", "1"]
    for rank in ("0", "1"):
        phases = report["ranks"][rank]
        assert set(phases) == {"loading", "training step", "evaluation", "saving"}
        assert all(event["peak_rss_gib"] > 0.1 for event in phases.values())
    rows = [row for row in report["phases"] if row["what"] == "training step"]
    assert [row["rank"] for row in rows] == [0, 1] and all(row["level"] == "RSS" for row in rows)
    planned = plan(load_recipe(builtin_path("demo"), two_ranks(name, *tactic)[1::2]))
    per_rank = planned.gpu.phase_gib("training step") / 2
    assert all(row["planned_gib"] == pytest.approx(per_rank) for row in rows)  # a rank's share of the CPU's plan
    assert re.search(r"^training step +1  RSS ", result.stdout, re.M) and "all 2 processes together" in result.stdout
    assert not any(process_running(pid) for pid in rank_pids(report))


def wait_for_event(events: Path, match, process: subprocess.Popen, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if events.exists():
            for line in events.read_text().splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if match(event):
                    return event
        time.sleep(0.05)
    raise AssertionError(f"no such event in {events} (tuner exited {process.poll()})")


def start_probe(tmp_path, *args: str) -> subprocess.Popen:
    import os

    return subprocess.Popen([sys.executable, "-m", "tuner", "probe", "demo", *args], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def launched(process: subprocess.Popen) -> list:
    import psutil

    return psutil.Process(process.pid).children(recursive=True)


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
def test_a_real_out_of_memory_on_one_rank_stops_every_rank_and_is_named(tmp_path, probe_home):
    """Rank 1 alone gets an address-space limit (RLIMIT_AS, set on its process once it has loaded) a quarter GiB
    above what it holds; its first worst-case step (64 x 256 tokens) needs more, and torch's CPU allocator fails."""
    import psutil

    probe = start_probe(tmp_path, *two_ranks("oom", "memory.distributed=ddp", "training.micro_batch_size=64",
                                             "training.max_seq_length=256"))
    events = tmp_path / "runs" / "oom" / "probe" / "events.jsonl"
    loaded = wait_for_event(events, lambda e: e["event"] == "probe" and e["rank"] == 1 and e["phase"] == "loading",
                            probe)
    processes = launched(probe)
    limit = int((loaded["address_space_gib"] + 0.25) * 2**30)
    psutil.Process(loaded["pid"]).rlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    out, err = probe.communicate(timeout=300)
    assert probe.returncode == 3, err[-3000:]
    assert "rank 1 ran out of memory during the training step on a batch of 64 x 256 tokens" in err
    stopped = float(err.split("every rank stopped ")[1].split(" s after rank 1's error")[0])
    assert stopped < 30
    assert not [p.pid for p in processes if process_running(p.pid)]  # the launcher and every rank are gone
    report = probe_json(tmp_path / "runs" / "oom")
    assert report["failure"]["rank"] == 1 and report["failure"]["phase"] == "training step"
    assert report["failure"]["kind"] == "out_of_memory" and report["status"] == "failed"


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
def test_a_signal_stops_the_probe_and_leaves_no_process(tmp_path, probe_home):
    probe = start_probe(tmp_path, *two_ranks("signal", "memory.distributed=ddp"))
    events = tmp_path / "runs" / "signal" / "probe" / "events.jsonl"
    wait_for_event(events, lambda e: e["event"] == "probe_phase" and e["phase"] == "training step", probe)
    processes = launched(probe)
    assert len(processes) >= 3  # the launcher and its two ranks
    probe.send_signal(signal.SIGTERM)
    out, err = probe.communicate(timeout=120)
    assert probe.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped by SIGTERM; the probe measured nothing complete." in err
    assert not [p.pid for p in processes if process_running(p.pid)]
    assert "Traceback" not in err


@pytest.mark.slow
def test_tune_batch_picks_the_fastest_measured_micro_batch_and_keeps_the_effective_batch(tmp_path, tuner_cli,
                                                                                      probe_home):
    (tmp_path / "mine.yaml").write_text(builtin_path("demo").read_text())
    before = (tmp_path / "mine.yaml").read_text()
    result = tuner_cli("probe", "mine.yaml", "--tune-batch", "--max-probes", "2", "--write",
                       *sets("data.max_samples=120", "data.eval_fraction=0", "training.micro_batch_size=2",
                             "training.gradient_accumulation_steps=2"),
                       cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    tuning = probe_json(tmp_path / "runs" / "demo")["tuning"]
    measured = [c for c in tuning["candidates"] if c["tokens_per_s"] is not None]
    assert [c["micro_batch_size"] for c in measured] == [4, 2]  # the largest feasible first, two launches
    assert all(c["micro_batch_size"] * c["gradient_accumulation_steps"] == 4 for c in tuning["candidates"])
    fastest = max(measured, key=lambda c: c["tokens_per_s"])
    chosen = [f"training.micro_batch_size={fastest['micro_batch_size']}",
              f"training.gradient_accumulation_steps={fastest['gradient_accumulation_steps']}"]
    assert tuning["chosen"] == chosen
    assert " ".join(f"--set {c}" for c in chosen) in result.stdout.splitlines()
    assert "safety margin: 10% of the device kept free" in result.stdout
    copy = load_recipe(tmp_path / "mine.tuned.yaml")
    assert (copy.training.micro_batch_size, copy.training.gradient_accumulation_steps) == (
        fastest["micro_batch_size"], fastest["gradient_accumulation_steps"])
    assert copy.data.max_samples == 120 and copy.effective_batch_size == 4  # the user's --set lines kept
    assert (tmp_path / "mine.yaml").read_text() == before  # the user's file is never touched


def test_the_plan_bar_marks_the_measured_peak_beside_the_prediction():
    from tuner.tui.widgets.plan_bar import measured_marker, plan_text

    recipe = load_recipe(builtin_path("demo"), ["hardware.host_ram_gb=2"])
    memory_plan = plan(recipe)
    record = MeasuredRecord("2026-12-01", 0.5, memory_plan.gpu.total_gib, "peak resident set of the process", "p.json")
    text = plan_text(memory_plan, 60, measured=record).plain
    line = next(line for line in text.splitlines() if "▲" in line)
    assert line.index("▲") == round(0.5 / 2 * 58)  # on the bar's scale: 2 GiB over 58 cells
    assert f"measured 2026-12-01: 0.50 GiB (plan {memory_plan.gpu.total_gib:.2f} GiB)" in line
    assert "▲" not in plan_text(memory_plan, 60).plain  # no probe, no marker
    late = measured_marker(1.9, memory_plan.gpu, 58, "measured").plain  # no room after it: the words go before
    assert late.rstrip().endswith("▲") and len(late) <= 58


@pytest.mark.slow
def test_the_wizards_probe_shows_measurements_and_marks_the_plan_bar(tmp_path, probe_home, monkeypatch):
    import asyncio

    from tui_helpers import QUICK_RUN, SIZE, demo_draft, make_app, settle, wait_until

    from tuner.tui.widgets.plan_bar import PlanPanel

    monkeypatch.chdir(tmp_path)

    async def scenario():
        app = make_app(demo_draft({**QUICK_RUN, "data.eval_fraction": 0.05}))
        async with app.run_test(size=SIZE) as pilot:
            app.switch_mode("run")
            await settle(pilot)
            await pilot.press("ctrl+p")
            await wait_until(pilot, lambda: app.run_watch is not None and app.run_watch.exit_code is not None,
                             timeout=300)
            watch = app.run_watch
            assert watch.kind == "probe" and watch.status == "measured", list(watch.log)[-20:]
            assert watch.run_dir.resolve() == tmp_path / "runs" / "demo" / "probe"
            assert any(line.startswith("probe: rank 0 measured training step") for line in watch.log)
            assert any(line.startswith("peak: ") for line in watch.outcome)
            await wait_until(pilot, lambda: app.measured is not None)
            app.switch_mode("method")
            await settle(pilot)
            panel = app.screen.query_one(PlanPanel)
            assert panel.measured == app.measured
            assert "▲ measured " in panel.render().plain

    asyncio.run(scenario())
