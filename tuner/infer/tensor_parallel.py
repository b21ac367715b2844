"""Tensor-parallel inference: ``tuner infer/chat --tp N`` splits every layer over N ranks on one machine with
transformers' tensor-parallel plan (``DistributedConfig(tp_size=N)``), where device_map="auto" places whole layers
one device after another.

The command checks its arguments, then runs N copies of itself (``python -m tuner <the same arguments>``), each in
its own session with torch's rank variables (gloo on a CPU, NCCL on GPUs, chosen by transformers). Rank 0 runs the
command as usual: it reads the prompts (or the terminal), prints the placement, the answers and the speed; each of
its ``generate`` calls is first sent to the other ranks, which run the same call on their slices (every rank joins
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
from tuner.infer.placement import GIB, rank_bytes, tensor_parallel_placement
from tuner.infer.target import InferenceTarget
from tuner.loading.model import ModelLoadError, load_model, load_tokenizer

RANKS_ENV = "TUNER_TP_RANKS"  # set (to N) in the environment of the ranks ``--tp N`` launches
LOCAL_ONLY = ("streamer", "stopping_criteria")  # generate() arguments that act on rank 0's output only
# prompts wait for the user: a chat may sit idle far longer than a collective's default timeout
PROMPT_TIMEOUT = timedelta(days=7)
AFTER_RANK_ZERO_S = 10.0  # the other ranks finish within this once rank 0 has finished (else they are stopped)
STOP_GRACE_S = 2.0
POLL_S = 0.2

_leading: list[TensorParallelModel] = []  # rank 0's model, released to the other ranks when the command ends


def tensor_parallel_rank() -> int | None:
    """This process's rank when it is one of the ranks ``--tp`` launched, else None."""
    return int(os.environ["RANK"]) if os.environ.get(RANKS_ENV) else None


def check_tensor_parallel(target: InferenceTarget, tp: int, *, bits: int | None = None, device_map_options=(),
                          gpus: int | None = None, cpus: int | None = None) -> None:
    """Refuse, before any rank starts, what ``--tp`` cannot run; ``device_map_options`` are the device_map
    flags given (``--max-memory``); ``gpus``/``cpus`` default to this machine's."""
    flag = f"--tp {tp}"
    drop = "or drop --tp to place the model with device_map=\"auto\""
    if bits or target.recipe.method.quantization is not None:
        given = f"--bits {bits}" if bits else f"method.quantization ({target.recipe.method.kind})"
        raise ModelLoadError(f"{flag} cannot load {given}: transformers' tensor-parallel plan splits 16/32-bit "
                             f"weights, not bitsandbytes' 4/8-bit ones; load the model unquantised ({drop}).")
    if device_map_options:
        raise ModelLoadError(f"{flag} with {' and '.join(device_map_options)}: those place whole layers over GPUs, "
                             f"CPU and disk with device_map=\"auto\", while every tensor-parallel rank holds a slice "
                             f"of every layer on its own device; drop them, {drop}.")
    if target.adapter is not None:
        raise ModelLoadError(f"{flag} cannot apply the adapter in {target.adapter} to a split model: merge it into "
                             f"its base model first (tuner merge RUN) and run the merged folder with {flag}.")
    _check_split(target, tp)
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cpus is None:
        cpus = os.cpu_count() or 1
    if gpus and tp > gpus:
        raise ModelLoadError(f"{flag} needs {tp} GPUs on this machine, {gpus} are visible: use --tp {gpus} or less.")
    if not gpus and tp > cpus:
        raise ModelLoadError(f"{flag} without a GPU runs {tp} processes on {cpus} CPU core(s): use --tp {cpus} or "
                             "less.")


def _check_split(target: InferenceTarget, tp: int) -> None:
    """The model has a tensor-parallel plan, and tp divides what it splits (the recipe check's rule)."""
    from transformers import AutoConfig

    from tuner.recipe.checks import tp_uneven

    facts, name = planner_facts(target), target.recipe.model.id
    if facts is not None:
        uneven, fitting = tp_uneven(facts, tp)
        if uneven:
            advice = f"use --tp {' or '.join(map(str, fitting))}" if fitting else "this model cannot be split"
            raise ModelLoadError(f"--tp {tp} must divide {name}'s {', '.join(uneven)}: {advice}, or drop --tp to "
                                 "place the model with device_map=\"auto\".")
    model = target.recipe.model
    try:
        config = AutoConfig.from_pretrained(target.model_path, revision=model.revision,
                                            trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError):
        return  # loading says why, on every rank
    if not getattr(config, "base_model_tp_plan", None):
        raise ModelLoadError(f"--tp: transformers has no tensor-parallel plan for {name} (model type "
                             f"{config.model_type}); drop --tp to place it with device_map=\"auto\".")


def launch_ranks(argv: list[str], tp: int) -> int:
    """Run ``python -m tuner *argv`` as ``tp`` ranks on this machine and return rank 0's exit code.

    A rank that fails stops the others; Ctrl-C, SIGTERM or SIGHUP stop them all (exit 128 + the signal).
    """
    from tuner.launch.run import EXIT_SIGNAL_BASE, RunInterrupted, signals_stop_the_run
    from tuner.launch.runner import child_environment, stop_process_groups

    shared = {RANKS_ENV: str(tp), "WORLD_SIZE": str(tp), "LOCAL_WORLD_SIZE": str(tp),
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
              "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // tp))}
    ranks: list[subprocess.Popen] = []
    with signals_stop_the_run():
        try:
            for rank in range(tp):
                env = child_environment({**shared, "RANK": str(rank), "LOCAL_RANK": str(rank)})
                # its own session: the terminal's Ctrl-C reaches tuner, which stops every rank
                ranks.append(subprocess.Popen([sys.executable, "-m", "tuner", *argv], env=env,
                                              start_new_session=True))
            return _follow_ranks(ranks)
        except KeyboardInterrupt:
            signum = signal.SIGINT
        except RunInterrupted as exc:
            signum = exc.signum
        print("stopping every rank ...", file=sys.stderr, flush=True)
        try:
            stop_process_groups(ranks, STOP_GRACE_S)
        except (KeyboardInterrupt, RunInterrupted):
            stop_process_groups(ranks, 0)
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


class TensorParallelModel:
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
    if tensor_parallel_rank():
        import warnings

        from transformers.utils import logging as hf_logging

        warnings.simplefilter("ignore")
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def _load_share(target: InferenceTarget, tp: int):
    """This rank's model, split by transformers' tensor-parallel plan; what every rank holds (gathered); notes."""
    import torch
    import torch.distributed as dist
    from transformers.distributed import DistributedConfig

    recipe = target.recipe.model_copy(deep=True)
    recipe.model.dtype, note = inference_dtype(target, on_gpu=torch.cuda.is_available())
    model = load_model(recipe, target.model_path, distributed_config=DistributedConfig(tp_size=tp))
    model.eval()
    group = dist.new_group(backend="gloo", timeout=PROMPT_TIMEOUT)
    held = [None] * tp
    dist.all_gather_object(held, (str(model.device), *rank_bytes(model), _device_budget(model.device, recipe)),
                           group=group)
    return TensorParallelModel(model, group), held, (note,) if note else ()


def _device_budget(device, recipe) -> int | None:
    """A GPU's memory less inference.gpu_headroom_gb; None on a CPU."""
    import torch

    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    return max(int(total - recipe.inference.gpu_headroom_gb * GIB), 0)


def load_tensor_parallel(target: InferenceTarget, tp: int, *, batch: int = 1, context: int) -> LoadedModel:
    """Rank 0: the split model (its generate calls run on every rank), its tokenizer and the per-rank placement."""
    share, held, notes = _load_share(target, tp)
    _leading.append(share)
    placement = tensor_parallel_placement(share.model, held, batch, context,
                                          int(target.recipe.inference.gpu_headroom_gb * GIB), notes,
                                          planner_facts(target))
    return LoadedModel(share, load_tokenizer(target.recipe, target.tokenizer_path), placement, target)


def follow_rank(target: InferenceTarget, tp: int) -> None:
    """Ranks 1..N-1: load this rank's share and run rank 0's generate calls until it is done."""
    share, _, _ = _load_share(target, tp)
    share.follow()


def release_ranks() -> None:
    """Rank 0, when the command ends: the other ranks stop following (a no-op when the model never loaded)."""
    while _leading:
        _leading.pop().release()
