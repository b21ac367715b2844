"""A one-host Slurm cluster of two nodes for tests: its own munge key and socket, config, state and logs in a fresh
folder, daemons stopped afterwards by the PIDs in their PID files.

Both nodes are slurmd processes on this host (``slurmd -N NAME``, ports apart, ``NodeAddr=127.0.0.1``). The first
node is named after this host, so the address the rendered slurm.sbatch gives rank 0 (the allocation's first host
name) resolves here as it would on a real cluster; the second is that name with ``-2``.  Needs the distribution's
``slurm-wlm`` and ``munge`` packages and root (slurmd starts jobs as their user).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

DAEMON_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol")


def slurm_missing() -> str | None:
    """None when a cluster can start here, else why not."""
    absent = [name for name in PROGRAMS if shutil.which(name, path=DAEMON_PATH) is None]
    if absent:
        return (f"Slurm is not installed here ({', '.join(absent)} missing): "
                "apt-get install -y slurm-wlm munge, then run this test again")
    if os.geteuid() != 0:
        return "a Slurm node (slurmd) starts jobs as their user and must run as root"
    try:
        socket.gethostbyname(socket.gethostname())
    except OSError:
        return f"this host's name {socket.gethostname()!r} does not resolve, so no node can be named after it"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(folder: Path, nodes: list[str]) -> str:
    host = socket.gethostname()
    lines = [
        "ClusterName=tunertest", f"SlurmctldHost={host}", f"SlurmctldPort={_free_port()}",
        "AuthType=auth/munge", f"AuthInfo=socket={folder}/munge.sock", "CredType=cred/munge",
        "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool/%n", f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd-%n.pid", f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd-%n.log",
        # no cgroups, accounting or MPI plugins: what a container offers
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "MpiDefault=none", "ReturnToService=2",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
    ]
    lines += [f"NodeName={node} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=1 RealMemory=4000 State=UNKNOWN"
              for node in nodes]
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _stop(pid_file: Path) -> None:
    """SIGTERM the daemon named by its PID file, SIGKILL if it is still there after 10 s."""
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().split()[0])
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


@contextmanager
def slurm_cluster(start_timeout_s: float = 60) -> Iterator[dict[str, str]]:
    """Start the cluster; yields the environment whose SLURM_CONF points the Slurm commands at it."""
    folder = Path(tempfile.mkdtemp(prefix="tuner-slurm-"))  # short: the munge socket path must fit 108 bytes
    nodes = [socket.gethostname(), f"{socket.gethostname()}-2"]
    (folder / "state").mkdir()
    for node in nodes:
        (folder / "spool" / node).mkdir(parents=True)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = folder / "slurm.conf"
    conf.write_text(_config(folder, nodes))
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": DAEMON_PATH}
    pid_files = [folder / "munged.pid", folder / "slurmctld.pid", *(folder / f"slurmd-{node}.pid" for node in nodes)]
    try:
        _start(folder, conf, key, nodes, env, start_timeout_s)
        yield env
    finally:
        for pid_file in reversed(pid_files):
            _stop(pid_file)
        shutil.rmtree(folder, ignore_errors=True)


def _start(folder: Path, conf: Path, key: Path, nodes: list[str], env: dict, start_timeout_s: float) -> None:
    """Start munge, the controller and the nodes; a sandbox where they cannot run skips the test, saying why."""
    import pytest

    try:
        # each daemon forks into the background and writes its PID file
        subprocess.run(["munged", "--force", f"--socket={folder}/munge.sock", f"--key-file={key}",
                        f"--log-file={folder}/munged.log", f"--pid-file={folder}/munged.pid",
                        f"--seed-file={folder}/munged.seed"], env=env, check=True, timeout=30)
        subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True, timeout=30)
        for node in nodes:
            subprocess.run(["slurmd", "-f", str(conf), "-N", node], env=env, check=True, timeout=30)
        deadline = time.monotonic() + start_timeout_s
        while True:
            states = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True)
            if states.stdout.split().count("idle") == len(nodes):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the nodes did not become idle in {start_timeout_s:.0f} s: {states.stdout}{states.stderr}")
            time.sleep(0.5)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        logs = "".join(log.read_text(errors="replace")[-1500:] for log in folder.glob("*.log"))
        pytest.skip(f"a Slurm cluster cannot start in this sandbox ({exc}); its logs:\n{logs}")
