"""The multi-machine preflight: the usual multi-node hangs turned into named messages.

Before the rendezvous, on each machine (``launch.sh N`` runs ``tuner doctor --preflight --machine-rank N``, and
``tuner doctor RECIPE`` runs the same checks): the run's hub model is in this machine's cache (downloaded then, with
``--preflight``), the machine rank is within range, rank 0's address resolves and
(from the other machines) has a route, and warnings name the classic causes of a hang: ``RANK`` or ``NODE_RANK``
set to another rank than the one the machine starts with, ``MASTER_ADDR``/``MASTER_PORT`` pointing elsewhere than
the recipe's rank 0, and several network interfaces with no ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` to pick one.

After the rendezvous, on every rank (the training entrypoint): each process's fingerprint (tuner, torch,
accelerate, transformers versions and its machine's GPU count) is gathered over a gloo group and compared; a
difference stops every rank with a message naming the field, both machines and both values.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

from tuner.check import Check
from tuner.reason import library_words
from tuner.recipe.schema import Recipe
from tuner.recipe.source import RecipeError
from tuner.render.launch_script import MAIN_PROCESS_IP_VARIABLE
# what must be the same on every machine, and what to do when it is not
FINGERPRINT_FIELDS = {
    "tuner": "install the same tuner on every machine",
    "torch": "install the same torch build on every machine",
    "accelerate": "install the same accelerate on every machine",
    "transformers": "install the same transformers on every machine",
    "gpus": "make the same number of GPUs visible on every machine (CUDA_VISIBLE_DEVICES, hardware.gpus_per_machine)",
}
INFINIBAND_DEVICES = Path("/sys/class/infiniband")


class MachinesDiffer(RecipeError):
    """The machines of one run differ in a library version or GPU count (found after the rendezvous)."""


# -- before the rendezvous ----------------------------------------------------------------------------------------

def main_process_address(recipe: Recipe, environ: Mapping[str, str] = os.environ) -> str:
    """Rank 0's address as launch.sh passes it: ``MAIN_PROCESS_IP`` when set (Slurm), else the recipe's."""
    return environ.get(MAIN_PROCESS_IP_VARIABLE) or str(recipe.hardware.main_process_ip)


def check_machine_rank(recipe: Recipe, machine_rank: int | None) -> Check:
    machines = recipe.hardware.machines
    if machine_rank is None:
        return Check("machine rank", "ok", f"{machines} machines; each starts launch.sh with its rank, 0 to {machines - 1}")
    if not 0 <= machine_rank < machines:
        return Check("machine rank", "fail", f"machine rank {machine_rank} is outside 0 to {machines - 1} "
                     f"(hardware.machines: {machines})", f"start each machine with its own rank, 0 to {machines - 1}")
    return Check("machine rank", "ok", f"machine {machine_rank} of {machines}")


def _local_addresses() -> dict[str, str]:
    """IPv4/IPv6 address -> interface name, for every interface that is up."""
    import psutil

    up = {name for name, stats in psutil.net_if_stats().items() if stats.isup}
    return {entry.address.split("%")[0]: name for name, entries in psutil.net_if_addrs().items() if name in up
            for entry in entries if entry.family in (socket.AF_INET, socket.AF_INET6)}


def route_to(address: str, port: int) -> str:
    """The local address this machine reaches ``address`` from (a UDP connect sends nothing); OSError if none."""
    family, _, _, _, target = socket.getaddrinfo(address, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)
        return probe.getsockname()[0]


def check_main_process(recipe: Recipe, machine_rank: int | None, environ: Mapping[str, str] = os.environ) -> Check:
    address, port = main_process_address(recipe, environ), recipe.hardware.main_process_port
    where = f"{address}:{port}"
    try:
        resolved = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        return Check("main process", "fail", f"rank 0's address {address} does not resolve here ({exc.strerror or exc})",
                     f"set hardware.main_process_ip (or {MAIN_PROCESS_IP_VARIABLE}) to an address every machine resolves")
    local = _local_addresses()
    if machine_rank == 0:
        if resolved not in local and not resolved.startswith("127."):
            return Check("main process", "warn", f"{where} is rank 0's rendezvous, but {resolved} is not an address of "
                         "this machine: the other machines will wait for a rank 0 that is elsewhere",
                         "start rank 0 on the machine hardware.main_process_ip names, or correct that address")
        return Check("main process", "ok", f"this machine hosts the rendezvous on {where}")
    try:
        source = route_to(resolved, port)
    except OSError as exc:
        return Check("main process", "fail", f"no route from this machine to rank 0 at {where} ({exc.strerror or exc})",
                     "check the address, the network and the firewall between the machines")
    via = f" via {local[source]}" if source in local else ""
    return Check("main process", "ok", f"rank 0 at {where} ({resolved}) is reached from {source}{via}")


def check_rank_variables(recipe: Recipe, machine_rank: int | None, environ: Mapping[str, str] = os.environ) -> Check:
    """Variables other launchers read, set to values that contradict this launch: the classic hangs."""
    address, port = main_process_address(recipe, environ), str(recipe.hardware.main_process_port)
    problems = []
    if machine_rank is not None:
        for name, meaning in (("RANK", "each process's global rank, which torchrun sets itself"),
                              ("NODE_RANK", "the machine rank of other launchers")):
            value = environ.get(name)
            if value is not None and value != str(machine_rank):
                problems.append(f"{name}={value} ({meaning}) but this machine starts as machine rank {machine_rank}: "
                                f"if you meant machine {value}, start launch.sh {value}")
    for name, expected in (("MASTER_ADDR", address), ("MASTER_PORT", port)):
        value = environ.get(name)
        if value is not None and value != expected:
            problems.append(f"{name}={value} but this run's rank 0 is {address}:{port}: every machine must name the "
                            "same rank 0")
    if problems:
        names = " ".join(dict.fromkeys(problem.split("=")[0] for problem in problems))
        return Check("rank variables", "warn", "; ".join(problems), f"unset {names} (launch.sh passes the rank and "
                     "address itself)")
    return Check("rank variables", "ok", "no RANK, NODE_RANK, MASTER_ADDR or MASTER_PORT contradicts this launch")


def check_interfaces(recipe: Recipe, machine_rank: int | None, environ: Mapping[str, str] = os.environ) -> Check:
    """On a host with several networks, gloo and NCCL may pick one the other machines cannot reach, and wait."""
    variables = ["GLOO_SOCKET_IFNAME"] + (["NCCL_SOCKET_IFNAME"] if recipe.uses_gpu else [])
    unset = [name for name in variables if not environ.get(name)]
    interfaces = sorted({name for address, name in _local_addresses().items()
                         if not (address.startswith("127.") or address == "::1" or address.startswith("fe80"))})
    problems, fixes = [], []
    if len(interfaces) > 1 and unset:
        try:
            source = route_to(main_process_address(recipe, environ), recipe.hardware.main_process_port)
            choice = _local_addresses().get(source, interfaces[0])
        except OSError:
            choice = interfaces[0]
        problems.append(f"{len(interfaces)} network interfaces ({', '.join(interfaces)}) and {', '.join(unset)} unset: "
                        "the ranks may pick one the other machines cannot reach")
        fixes.append(" ".join(f"export {name}={choice}" for name in unset) + " (the interface that reaches rank 0)")
    host_adapters = sorted(entry.name for entry in INFINIBAND_DEVICES.iterdir()) if INFINIBAND_DEVICES.is_dir() else []
    if recipe.uses_gpu and len(host_adapters) > 1 and not environ.get("NCCL_IB_HCA"):
        problems.append(f"{len(host_adapters)} InfiniBand adapters ({', '.join(host_adapters)}) and NCCL_IB_HCA unset")
        fixes.append(f"export NCCL_IB_HCA={','.join(host_adapters)} (the ones cabled to the other machines)")
    if problems:
        return Check("interfaces", "warn", "; ".join(problems), "; ".join(fixes))
    chosen = ", ".join(f"{name}={environ[name]}" for name in variables if environ.get(name))
    return Check("interfaces", "ok", f"{len(interfaces)} network interface(s)" + (f"; {chosen}" if chosen else ""))


MACHINE_CHECKS = (check_main_process, check_rank_variables, check_interfaces)


def machine_checks(recipe: Recipe, machine_rank: int | None = None,
                   environ: Mapping[str, str] = os.environ) -> list[Check]:
    """The checks one machine of a multi-machine run makes before its rendezvous ([] for a one-machine run)."""
    if recipe.hardware.machines == 1:
        return []
    rank = check_machine_rank(recipe, machine_rank)
    if rank.status == "fail":
        return [rank]
    results = [rank]
    for check in MACHINE_CHECKS:
        try:
            results.append(check(recipe, machine_rank, environ))
        except Exception as exc:  # like doctor's checks: a line, never a traceback
            results.append(Check(check.__name__.removeprefix("check_").replace("_", " "), "fail",
                                 f"the check itself failed: {type(exc).__name__}: {library_words(exc)}"))
    return results


def fetch_run_model(run_dir: Path) -> Check | None:
    """This machine's copy of the hub model ``tuner run`` recorded for the run (its commit and files), downloaded
    now when the cache lacks any of it, before the rendezvous: every rank loads it from this machine's cache.
    None when the run recorded no hub model.  Machines sharing one cache download it once (huggingface_hub locks
    each file while it is written; the other machines wait and reuse it)."""
    import sys

    from tuner.catalog.hub import HubError
    from tuner.free_space import check_download_room
    from tuner.loading.hub_download import HubDownload, download
    from tuner.rundir.layout import MODEL_SNAPSHOT

    record = run_dir / MODEL_SNAPSHOT
    if not record.is_file():
        return None
    planned = HubDownload.from_json(record.read_text(encoding="utf-8"))
    if planned.missing:
        room = check_download_room(planned)
        if room.status == "fail":
            return Check("model files", "fail", room.detail, room.fix)
        print(planned.describe(), file=sys.stderr, flush=True)
        try:
            download(planned)
        except HubError as exc:
            return Check("model files", "fail", str(exc))
    return Check("model files", "ok", f"{planned.model_id} (commit {planned.commit[:12]}): all {len(planned.files)} "
                                      f"files in this machine's Hugging Face cache {planned.cache_dir}")


# -- after the rendezvous -----------------------------------------------------------------------------------------

def machine_fingerprint() -> dict:
    """What must match across machines, with the machine's rank and host name to name it by."""
    import accelerate
    import torch
    import transformers

    import tuner

    return {"machine_rank": int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", 0))),
            "host": socket.gethostname(), "tuner": tuner.__version__, "torch": torch.__version__,
            "accelerate": accelerate.__version__, "transformers": transformers.__version__,
            "gpus": torch.cuda.device_count()}


def fingerprint_difference(fingerprints: list[dict]) -> str | None:
    """The first field in which a process differs from rank 0's, named with both machines and both values."""
    first = fingerprints[0]
    for field, fix in FINGERPRINT_FIELDS.items():
        other = next((each for each in fingerprints[1:] if each[field] != first[field]), None)
        if other is not None:
            def who(each: dict) -> str:
                return f"machine {each['machine_rank']} ({each['host']})"

            return (f"the machines of this run differ in {field}: {who(first)} has {first[field]}, {who(other)} has "
                    f"{other[field]}; {fix}, then start every machine again (tuner doctor on each shows them).")
    return None


def exchange_fingerprints(fingerprint: dict) -> list[dict]:
    """Every process's fingerprint, in rank order; a collective, so every rank calls it (over gloo, even beside NCCL)."""
    import torch.distributed as dist

    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, fingerprint, group=group)
    return gathered


def check_same_machines(fingerprint: dict | None = None) -> list[dict]:
    """After the rendezvous, on every rank: the gathered fingerprints, or MachinesDiffer (raised on every rank
    alike, so all of them stop instead of some waiting in a collective).  Before raising, the process group is
    taken down: left up, gloo aborts the process at exit once a peer has gone (seen here 1 time in 6)."""
    import torch.distributed as dist

    gathered = exchange_fingerprints(fingerprint if fingerprint is not None else machine_fingerprint())
    difference = fingerprint_difference(gathered)
    if difference:
        dist.destroy_process_group()
        raise MachinesDiffer([difference])
    return gathered
