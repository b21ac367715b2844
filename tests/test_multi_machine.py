"""Multi-machine runs proven on one host: two machine ranks over localhost train one run (started by hand with
launch.sh at once on a cold home they share, and on cold homes of their own; and by a real two-node Slurm cluster
when Slurm is installed), and the preflight
turns the usual multi-node hangs (a wrong rank, an unreachable rank 0, contradicting variables, machines with
different libraries) into named messages."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from slurm_cluster import slurm_cluster, slurm_missing
from test_cpu_ranks import check_data_parallel_run, free_port

from conftest import REPO, builds_of
from tuner.build_once import is_built, lock_path
from tuner.cli import main
from tuner.rundir.events import read_records
from tuner.preflight import check_interfaces, fingerprint_difference, machine_checks
from tuner.recipe.io import validate_recipe
from tuner.rundir.layout import EVENTS_FILE, LAUNCH_SCRIPT, SLURM_SCRIPT

TWO_CPU_MACHINES = {"machines": 2, "main_process_ip": "127.0.0.1", "main_process_port": 29400}


def two_machine_recipe(**hardware):
    return validate_recipe({"name": "two", "model": {"id": "builtin:demo"}, "memory": {"distributed": "ddp"},
                            "hardware": {**TWO_CPU_MACHINES, **hardware}})


def machine_env(**extra: str) -> dict[str, str]:
    """The environment each machine's launch.sh runs in: this venv's tuner and accelerate first on PATH."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for name in ("RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "MAIN_PROCESS_IP"):
        env.pop(name, None)
    return {**env, **extra}


def start_machine(script: Path, rank: int, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(script), str(rank)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def render_two_machine_run(project: Path, tuner_cli) -> Path:
    """The demo on two CPU machines (one gloo process each), a few steps: its run directory, rendered."""
    settings = ["name=two", "hardware.machines=2", "hardware.main_process_ip=127.0.0.1",
                f"hardware.main_process_port={free_port()}", "memory.distributed=ddp", "training.max_steps=6",
                "training.warmup_steps=0", "training.logging_steps=1", "data.max_samples=120", "data.eval_fraction=0",
                "training.micro_batch_size=4"]
    rendered = tuner_cli("render", "demo", *(arg for setting in settings for arg in ("--set", setting)), cwd=project)
    assert rendered.returncode == 0, rendered.stderr
    return project / "runs" / "two"


def check_two_machine_run(run_dir: Path, initial_model: Path) -> None:
    check_data_parallel_run(run_dir, initial_model)
    (joined,) = [event for event in read_records(run_dir / EVENTS_FILE) if event["event"] == "machines"]
    assert [machine["machine_rank"] for machine in joined["machines"]] == [0, 1]


def start_and_finish_machines(run_dir: Path, cwd: Path, homes: tuple[Path, Path]) -> str:
    """Start launch.sh 0 and launch.sh 1 at once, machine ``i`` with ``TUNER_HOME=homes[i]``; both must exit 0 after
    their preflight.  Returns their outputs together."""
    machines = [start_machine(run_dir / LAUNCH_SCRIPT, rank, cwd, machine_env(TUNER_TRACE_RANKS="1",
                                                                             TUNER_HOME=str(homes[rank])))
                for rank in (0, 1)]
    try:
        outputs = [machine.communicate(timeout=240)[0] for machine in machines]
    finally:
        for machine in machines:  # a hung rendezvous must not outlive the test: stop each machine's whole session
            if machine.poll() is None:
                os.killpg(machine.pid, signal.SIGKILL)
                machine.wait()
    for rank, (machine, output) in enumerate(zip(machines, outputs)):
        assert machine.returncode == 0, f"machine {rank}:\n{output[-4000:]}"
        assert f"machine {rank} of 2" in output  # its preflight ran before the rendezvous
    return "".join(outputs)


def kill_a_demo_model_build(home: Path) -> None:
    """Start building the demo model in ``home`` and SIGKILL the builder (and the process it builds in) mid-build: it
    holds the lock and its hidden staging folder exists, nothing is published."""
    builder = subprocess.Popen([sys.executable, "-c", "from tuner.loading.demo_model import builtin_model_path; "
                                "builtin_model_path('builtin:demo')"],
                               env={**os.environ, "PYTHONPATH": str(REPO), "TUNER_HOME": str(home)},
                               start_new_session=True)
    try:
        while not list((home / "models").glob(".demo.*.tmp")):
            assert builder.poll() is None, "the builder ended before it could be killed mid-build"
            time.sleep(0.01)
    finally:
        os.killpg(builder.pid, signal.SIGKILL)
        builder.wait()
    assert lock_path(home / "models" / "demo").exists() and not is_built(home / "models" / "demo")


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
def test_two_machines_sharing_one_cold_home_build_each_cache_once_and_train(tmp_path, tuner_cli):
    """The home of a cluster is one filesystem: both machines ask for the demo model and the prepared dataset at
    once, on a home where a builder was killed mid-build; one builds each while the other waits, and they train."""
    home = tmp_path / "home"
    run_dir = render_two_machine_run(tmp_path, tuner_cli)
    kill_a_demo_model_build(home)
    output = start_and_finish_machines(run_dir, tmp_path, (home, home))
    assert "left by a build of the built-in demo model that did not finish" in output
    assert builds_of(output, "the built-in demo model") == 1 and builds_of(output, "the prepared dataset") == 1
    check_two_machine_run(run_dir, home / "models" / "demo")


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
def test_two_machines_with_homes_of_their_own_each_build_their_caches_and_train(tmp_path, tuner_cli):
    homes = (tmp_path / "home0", tmp_path / "home1")
    run_dir = render_two_machine_run(tmp_path, tuner_cli)
    output = start_and_finish_machines(run_dir, tmp_path, homes)
    assert builds_of(output, "the built-in demo model") == 2 and builds_of(output, "the prepared dataset") == 2
    assert all(is_built(home / "models" / "demo") for home in homes)
    check_two_machine_run(run_dir, homes[1] / "models" / "demo")  # the same seeded weights on either machine


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
@pytest.mark.skipif(bool(slurm_missing()), reason=slurm_missing() or "")
def test_the_rendered_sbatch_runs_on_a_real_two_node_slurm_cluster(tmp_path, tuner_cli, demo_model_path):
    """sbatch --wait of the rendered slurm.sbatch: the job completes and the run is the same complete run."""
    run_dir = render_two_machine_run(tmp_path, tuner_cli)
    with slurm_cluster() as cluster:
        env = {**machine_env(TUNER_TRACE_RANKS="1"), "SLURM_CONF": cluster["SLURM_CONF"]}
        job = subprocess.run(["sbatch", "--wait", str(run_dir.relative_to(tmp_path) / SLURM_SCRIPT)], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
    (log,) = run_dir.glob("slurm-*.log")
    assert job.returncode == 0, job.stdout + job.stderr + log.read_text()[-4000:]
    output = log.read_text()
    assert "machine 0 of 2" in output and "machine 1 of 2" in output  # each node's preflight
    check_two_machine_run(run_dir, demo_model_path)


MISMATCH_RANK = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    from tuner.preflight import MachinesDiffer, check_same_machines, machine_fingerprint

    rank, torch_version = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    fingerprint = {**machine_fingerprint(), "machine_rank": rank, "torch": torch_version}
    try:
        check_same_machines(fingerprint)
    except MachinesDiffer as exc:
        print(exc)
        sys.exit(2)
""")


@pytest.mark.slow
def test_a_version_mismatch_between_machines_stops_both_naming_both_versions(tmp_path):
    """Two processes over a real gloo group, each with its own torch version in its fingerprint."""
    env = {**machine_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    ranks = [subprocess.Popen([sys.executable, "-c", MISMATCH_RANK, str(rank), version], env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, version in ((0, "2.13.0+cpu"), (1, "2.12.1+cpu"))]
    for process in ranks:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 2, err[-3000:]
        assert "differ in torch: machine 0" in out and "has 2.13.0+cpu" in out, out
        assert "machine 1" in out and "has 2.12.1+cpu" in out, out


def test_a_gpu_count_difference_names_the_field_and_both_counts():
    same = {"host": "a", "tuner": "0.1.0", "torch": "2.13.0", "accelerate": "1.15.0", "transformers": "5.24.0"}
    message = fingerprint_difference([{**same, "machine_rank": 0, "gpus": 8}, {**same, "machine_rank": 1, "host": "b", "gpus": 4}])
    assert message.startswith("the machines of this run differ in gpus: machine 0 (a) has 8, machine 1 (b) has 4")
    assert "CUDA_VISIBLE_DEVICES" in message
    assert fingerprint_difference([{**same, "machine_rank": 0, "gpus": 8}] * 2) is None


def checks_by_name(recipe, rank, environ):
    return {check.name: check for check in machine_checks(recipe, rank, environ)}


def test_a_machine_rank_out_of_range_fails_naming_the_range():
    (check,) = machine_checks(two_machine_recipe(), 2, {})
    assert check.status == "fail" and "machine rank 2 is outside 0 to 1 (hardware.machines: 2)" in check.detail


def test_rank_zero_address_that_does_not_resolve_fails_on_the_other_machines():
    check = checks_by_name(two_machine_recipe(), 1, {"MAIN_PROCESS_IP": "no-such-host.invalid"})["main process"]
    assert check.status == "fail" and "no-such-host.invalid does not resolve" in check.detail
    reached = checks_by_name(two_machine_recipe(), 1, {})["main process"]
    assert reached.status == "ok" and "127.0.0.1:29400" in reached.detail


def test_classic_hang_variables_are_named_warnings():
    check = checks_by_name(two_machine_recipe(), 0, {"RANK": "1", "MASTER_ADDR": "10.9.9.9", "NODE_RANK": "0"})
    variables = check["rank variables"]
    assert variables.status == "warn"
    assert "RANK=1" in variables.detail and "start launch.sh 1" in variables.detail
    assert "MASTER_ADDR=10.9.9.9 but this run's rank 0 is 127.0.0.1:29400" in variables.detail
    assert "NODE_RANK" not in variables.detail  # it agrees with the machine rank
    assert variables.fix.startswith("unset RANK MASTER_ADDR")
    assert checks_by_name(two_machine_recipe(), 0, {})["rank variables"].status == "ok"


def test_several_network_interfaces_without_a_socket_variable_warn(monkeypatch):
    """This host has one network; a second is stood in by the address table the check reads."""
    monkeypatch.setattr("tuner.preflight._local_addresses",
                        lambda: {"127.0.0.1": "lo", "10.0.0.5": "eth0", "192.168.7.5": "eth1"})
    recipe = two_machine_recipe(gpus_per_machine=8, gpu="H100-80GB", num_processes=16)
    check = check_interfaces(recipe, 1, {})
    assert check.status == "warn" and "2 network interfaces (eth0, eth1)" in check.detail
    assert "GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME unset" in check.detail
    assert check_interfaces(recipe, 1, {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}).status == "ok"


def test_launch_sh_stops_before_the_rendezvous_when_rank_zero_does_not_resolve(tmp_path, tuner_cli):
    """The real preflight in the real script: the launcher (a stub here) is never started."""
    rendered = tuner_cli("render", "demo", "--set", "name=two", "--set", "hardware.machines=2", "--set",
                         "hardware.main_process_ip=127.0.0.1", "--set", "memory.distributed=ddp", cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    stub = tmp_path / "bin" / "accelerate"
    stub.parent.mkdir()
    stub.write_text(f'#!/usr/bin/env bash\ntouch {tmp_path / "launched"}\n')
    stub.chmod(0o755)
    env = machine_env(MAIN_PROCESS_IP="no-such-host.invalid")
    env["PATH"] = f"{stub.parent}{os.pathsep}{env['PATH']}"
    result = subprocess.run(["bash", str(tmp_path / "runs" / "two" / LAUNCH_SCRIPT), "1"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "FAIL  main process" in result.stdout and "no-such-host.invalid does not resolve" in result.stdout
    assert not (tmp_path / "launched").exists()
    env.pop("MAIN_PROCESS_IP")
    started = subprocess.run(["bash", str(tmp_path / "runs" / "two" / LAUNCH_SCRIPT), "1"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0 and (tmp_path / "launched").exists(), started.stdout + started.stderr


def test_doctor_with_a_multi_machine_recipe_adds_the_machine_checks(tmp_path, capsys, monkeypatch):
    recipe = tmp_path / "two.yaml"
    recipe.write_text("name: two\nmodel: {id: 'builtin:demo'}\nmemory: {distributed: ddp}\n"
                      "hardware: {machines: 2, main_process_ip: 127.0.0.1}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    assert main(["doctor", str(recipe), "--machine-rank", "1"]) == 0
    out = capsys.readouterr().out
    assert "machine 1 of 2" in out and "rank 0 at 127.0.0.1:29500" in out
    assert "warn  rank variables     RANK=0" in out
    assert "ok    torch" in out  # the machine's own checks too
    assert main(["doctor", "demo", "--preflight"]) == 2
    assert "--preflight checks a multi-machine recipe" in capsys.readouterr().err
