"""Inference over N ranks of this machine (``tuner infer/chat --tp N`` or ``--pp N``): the model split by
transformers' own engine (``from_pretrained(distributed_config=DistributedConfig(tp_size=..., pp_size=...))``).

The command checks its arguments, then runs N copies of itself (``python -m tuner <the same arguments>``), each in
its own session with torch's rank variables (gloo on a CPU, NCCL on GPUs, chosen by transformers). Rank 0 runs the
command as usual: it reads the prompts (or the terminal), prints the placement, the answers and the speed; each of
its ``generate`` calls is first sent to the other ranks, which run the same call on their share (every rank joins
every forward pass) and print nothing but errors. Ctrl-C, SIGTERM or SIGHUP stop every rank, as for ``tuner run``.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

from tuner.infer.load import LoadedModel, inference_dtype, planner_facts
from tuner.infer.placement import GIB
from tuner.infer.rank_placement import pipeline_placement, rank_bytes, stage_held, tensor_parallel_placement
from tuner.infer.target import InferenceTarget
from tuner.loading.model import ModelLoadError, load_model, load_tokenizer

RANKS_ENV = "TUNER_INFER_RANKS"  # set (to N) in the environment of the ranks ``--tp N`` / ``--pp N`` launches
LOCAL_ONLY = ("streamer", "stopping_criteria")  # generate() arguments that act on rank 0's output only
# prompts wait for the user: a chat may sit idle far longer than a collective's default timeout
PROMPT_TIMEOUT = timedelta(days=7)
AFTER_RANK_ZERO_S = 10.0  # the other ranks finish within this once rank 0 has finished (else they are stopped)
STOP_GRACE_S = 2.0
POLL_S = 0.2

_leading: list[RankModel] = []  # rank 0's model, released to the other ranks when the command ends


def inference_rank() -> int | None:
    """This process's rank when it is one of the ranks ``--tp``/``--pp`` launched, else None."""
    return int(os.environ["RANK"]) if os.environ.get(RANKS_ENV) else None


def check_split_loading(target: InferenceTarget, flag: str, holds: str, device_map_options=()) -> None:
    """What every split refuses before a rank starts: device_map flags (``--max-memory``) and an unmerged adapter;
    ``holds`` says what each rank holds instead of whole layers placed one device after another."""
    if device_map_options:
        raise ModelLoadError(f"{flag} with {' and '.join(device_map_options)}: those place whole layers over GPUs, "
                             f"CPU and disk with device_map=\"auto\", while {holds} on its own device; drop them, "
                             f"or drop {flag.split()[0]} to place the model with device_map=\"auto\".")
    if target.adapter is not None:
        raise ModelLoadError(f"{flag} cannot apply the adapter in {target.adapter} to a split model: merge it into "
                             f"its base model first (tuner merge RUN) and run the merged folder with {flag}.")


def check_rank_count(flag: str, ranks: int, gpus: int | None = None, cpus: int | None = None) -> None:
    """No more ranks than this machine's GPUs (or, without one, its CPU cores); ``gpus``/``cpus`` default to this
    machine's."""
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cpus is None:
        cpus = os.cpu_count() or 1
    option = flag.split()[0]
    if gpus and ranks > gpus:
        raise ModelLoadError(f"{flag} needs {ranks} GPUs on this machine, {gpus} are visible: use {option} {gpus} or "
                             "less.")
    if not gpus and ranks > cpus:
        raise ModelLoadError(f"{flag} without a GPU runs {ranks} processes on {cpus} CPU core(s): use {option} {cpus} "
                             "or less.")


def launch_ranks(argv: list[str], ranks: int) -> int:
    """Run ``python -m tuner *argv`` as ``ranks`` ranks on this machine and return rank 0's exit code.

    A rank that fails stops the others; Ctrl-C, SIGTERM or SIGHUP stop them all (exit 128 + the signal).
    """
    from tuner.launch.run import EXIT_SIGNAL_BASE, RunInterrupted, signals_stop_the_run
    from tuner.launch.runner import child_environment, stop_process_groups

    shared = {RANKS_ENV: str(ranks), "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks),
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
              "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // ranks))}
    started: list[subprocess.Popen] = []
    with signals_stop_the_run():
        try:
            for rank in range(ranks):
                env = child_environment({**shared, "RANK": str(rank), "LOCAL_RANK": str(rank)})
                # its own session: the terminal's Ctrl-C reaches tuner, which stops every rank
                started.append(subprocess.Popen([sys.executable, "-m", "tuner", *argv], env=env,
                                                start_new_session=True))
            return _follow_ranks(started)
        except KeyboardInterrupt:
            signum = signal.SIGINT
        except RunInterrupted as exc:
            signum = exc.signum
        print("stopping every rank ...", file=sys.stderr, flush=True)
        try:
            stop_process_groups(started, STOP_GRACE_S)
        except (KeyboardInterrupt, RunInterrupted):
            stop_process_groups(started, 0)
    return EXIT_SIGNAL_BASE + signum


def _follow_ranks(ranks: list[subprocess.Popen]) -> int:
    """Wait for rank 0 (the others then finish, or are stopped); a failing rank stops them all."""
    from tuner.launch.runner import stop_process_groups

    while True:
        code = ranks[0].poll()
        if code is not None:
            deadline = time.monotonic() + (AFTER_RANK_ZERO_S if code == 0 else 0)
            while time.monotonic() < deadline and any(rank.poll() is None for rank in ranks):
                time.sleep(POLL_S)
            stop_process_groups(ranks, STOP_GRACE_S)
            return code
        failed = next(((number, rank.returncode) for number, rank in enumerate(ranks[1:], 1) if rank.poll()), None)
        if failed:
            print(f"rank {failed[0]} failed (exit code {failed[1]}); stopping every rank", file=sys.stderr, flush=True)
            stop_process_groups(ranks, STOP_GRACE_S)
            return failed[1]
        time.sleep(POLL_S)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RankModel:
    """A rank's share of the split model. Rank 0 uses it as the model (attributes are the model's); each of its
    ``generate`` calls is sent first to the other ranks, which :meth:`follow` until rank 0 :meth:`release` s them."""

    def __init__(self, model, prompts_group):
        self.model = model
        self.prompts_group = prompts_group  # gloo, with a timeout that outlasts a user's pause

    def __getattr__(self, name):
        return getattr(self.model, name)

    def _broadcast(self, message=None):
        import torch.distributed as dist

        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.prompts_group)
        return box[0]

    def generate(self, **kwargs):
        """Rank 0: the same generate call on every rank (the same seed, so sampling picks the same tokens)."""
        import torch

        seed = random.randrange(2**63)
        sent = {key: value.cpu() if isinstance(value, torch.Tensor) else value
                for key, value in kwargs.items() if key not in LOCAL_ONLY}
        self._broadcast((sent, seed))
        torch.manual_seed(seed)
        return self.model.generate(**kwargs)

    def follow(self) -> None:
        """Ranks 1..N-1: run rank 0's generate calls until it releases them."""
        import torch

        while (message := self._broadcast()) is not None:
            sent, seed = message
            torch.manual_seed(seed)
            with torch.no_grad():
                self.model.generate(**{key: value.to(self.model.device) if isinstance(value, torch.Tensor) else value
                                       for key, value in sent.items()})
        _leave()

    def release(self) -> None:
        """Rank 0: tell the other ranks that no more generate calls come."""
        self._broadcast(None)
        _leave()


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def join_ranks() -> None:
    """In every rank: SIGINT ends it at once (only tuner sends it, to stop every rank); ranks after 0 run no command
    code, and the libraries' warnings and progress bars are turned off there."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if inference_rank():
        import warnings

        from transformers.utils import logging as hf_logging

        warnings.simplefilter("ignore")
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def _load_share(target: InferenceTarget, tp: int, pp: int) -> tuple[RankModel, list, tuple]:
    """This rank's share of the model, split by transformers (``DistributedConfig(tp_size=tp, pp_size=pp)``); what
    every rank holds, gathered (its device, its split and replicated bytes or its stage, its budget); notes."""
    import torch
    import torch.distributed as dist
    from transformers.distributed import DistributedConfig

    recipe = target.recipe.model_copy(deep=True)
    recipe.model.dtype, note = inference_dtype(target, on_gpu=torch.cuda.is_available())
    model = load_model(recipe, target.model_path, distributed_config=DistributedConfig(tp_size=tp, pp_size=pp))
    model.eval()
    group = dist.new_group(backend="gloo", timeout=PROMPT_TIMEOUT)
    held_by = stage_held if pp > 1 else rank_bytes
    held = [None] * (tp * pp)
    dist.all_gather_object(held, (str(model.device), *held_by(model), _device_budget(model.device, recipe)),
                           group=group)
    return RankModel(model, group), held, (note,) if note else ()


def load_split(target: InferenceTarget, tp: int, pp: int, *, batch: int = 1, context: int) -> LoadedModel:
    """Rank 0: the split model (its generate calls run on every rank), its tokenizer and the per-rank placement."""
    share, held, notes = _load_share(target, tp, pp)
    _leading.append(share)
    place = pipeline_placement if pp > 1 else tensor_parallel_placement
    placement = place(share.model, held, batch, context, int(target.recipe.inference.gpu_headroom_gb * GIB), notes,
                      planner_facts(target))
    return LoadedModel(share, load_tokenizer(target.recipe, target.tokenizer_path), placement, target)


def follow_rank(target: InferenceTarget, tp: int, pp: int) -> None:
    """Ranks 1..N-1: load this rank's share and run rank 0's generate calls until it is done."""
    _load_share(target, tp, pp)[0].follow()


def _device_budget(device, recipe) -> int | None:
    """A GPU's memory less inference.gpu_headroom_gb; None on a CPU."""
    import torch

    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    return max(int(total - recipe.inference.gpu_headroom_gb * GIB), 0)


def release_ranks() -> None:
    """Rank 0, when the command ends: the other ranks stop following (a no-op when the model never loaded)."""
    while _leading:
        _leading.pop().release()
