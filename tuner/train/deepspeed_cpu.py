"""DeepSpeed on CPU ranks: one gloo process group, and no compiler run at start-up.

Accelerate sets up DeepSpeed's communication only on accelerators, and ZeRO-3's sharded load needs it, so a CPU
run initialises it itself.  DeepSpeed (0.16+) would also JIT-compile its shared-memory all-reduce op with g++ the
first time a CPU rank starts: 1.5 to 4 minutes on two cores, with every rank of every run waiting on one file lock
in the torch extensions folder, and a rank stopped meanwhile leaves that lock behind, so every later run waits for
ever.  tuner's CPU runs exist to try recipes small, so they use gloo's own collectives instead.
"""
from __future__ import annotations


def init_cpu_deepspeed() -> None:
    """Initialise DeepSpeed's process group on gloo without building its shared-memory op."""
    import importlib

    import deepspeed

    # the module, not the attribute: deepspeed.comm's own `import torch` rebinds deepspeed.comm.torch to torch
    backend = importlib.import_module("deepspeed.comm.torch")
    backend.build_shm_op = lambda: None  # read by TorchBackend when the group is created: None means gloo
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
