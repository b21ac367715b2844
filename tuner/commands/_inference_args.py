"""Arguments shared by ``tuner infer`` and ``tuner chat``: what to load, where to place it, how to sample."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from tuner.commands._recipe_args import add_recipe_arguments
from tuner.commands._types import at_least, memory_budget, recipe_field
from tuner.rundir.library_output import VERBOSE_HELP, libraries_to_log


def add_inference_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser, required=False,
                         help="recipe YAML file, built-in recipe name, or a tuner run directory (runs/<name>)")
    load = parser.add_argument_group("model and placement")
    load.add_argument("--model", metavar="PATH_OR_ID",
                      help="model directory or hub id (replaces the recipe's model.id)")
    load.add_argument("--adapter", metavar="DIR", help="LoRA adapter folder or tuner run directory to apply")
    load.add_argument("--bits", type=int, choices=(4, 8), help="quantise the base weights with bitsandbytes")
    load.add_argument("--max-memory", action="append", default=[], metavar="DEVICE=SIZE", type=memory_budget,
                      help="memory budget per device, e.g. --max-memory 0=20GiB --max-memory cpu=64GiB "
                           "(replaces the budget derived from the recipe's hardware; the rest goes to disk)")
    load.add_argument("--offload-folder", metavar="DIR",
                      help="where weights that fit nowhere else go (default: inference.offload_folder, "
                           "<run dir>/offload, or a temporary folder)")
    load.add_argument("--tp", type=at_least(1), default=1, metavar="N",
                      help="tensor parallelism: split every layer over N ranks of this machine (N GPUs, or N CPU "
                           "processes) with transformers' tensor-parallel plan, instead of placing whole layers "
                           "one device after another with device_map=auto")
    load.add_argument("--pp", type=at_least(1), default=1, metavar="N",
                      help="pipeline stages: give each of N ranks of this machine a run of whole layers (N GPUs, or "
                           "N CPU processes) with transformers' pipeline stages; the stages compute one after another")
    load.add_argument("--context", type=at_least(1), metavar="TOKENS",
                      help="context length the KV cache is predicted for "
                           "(default: training.max_seq_length + max new tokens)")
    sample = parser.add_argument_group("sampling (default: the recipe's inference section)")
    sample.add_argument("--max-new-tokens", type=recipe_field("inference.max_new_tokens"), metavar="N")
    sample.add_argument("--temperature", type=recipe_field("inference.temperature"))
    sample.add_argument("--top-p", type=recipe_field("inference.top_p"))
    sample.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=None,
                        help="always pick the most likely token (--no-greedy samples)")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    prompt = parser.add_argument_group("prompt format (default: as the recipe's or run's data was trained)")
    prompt.add_argument("--instruction", metavar="TEXT",
                        help="for instruction-trained runs: the instruction each message is the input of "
                             "(default: the one instruction the training data shares, e.g. the demo's 'reverse')")


def load_from_args(args: argparse.Namespace, batch: int = 1):
    """Resolve, load and place the model the arguments name; print the placement and its warnings to stderr.

    Returns the :class:`~tuner.infer.load.LoadedModel` and the :class:`~tuner.infer.generate.Sampling`.
    """
    from rich.console import Console

    from tuner.infer.generate import Sampling
    from tuner.infer.load import default_context, load_for_inference
    from tuner.infer.placement import placement_table
    from tuner.infer.target import resolve_target
    from tuner.recipe.warnings import recipe_warnings

    target = resolve_target(args.recipe, args.overrides, args.model, args.adapter)
    for warning in recipe_warnings(target.recipe):  # before loading: remote code runs while the model loads
        print(f"warning: {warning}", file=sys.stderr)
    sampling = Sampling.from_recipe(target.recipe, args.max_new_tokens, args.greedy, args.temperature, args.top_p)
    max_memory = dict(args.max_memory) or None
    check_devices(max_memory)
    context = args.context or default_context(target, sampling.max_new_tokens)
    with libraries_to_log(target.run_dir, args.verbose):
        if args.tp > 1 or args.pp > 1:  # one of the ranks run_on_ranks launched: rank 0 (the others follow it)
            from tuner.infer.ranks import load_split

            loaded = load_split(target, args.tp, args.pp, batch=batch, context=context)
        else:
            loaded = load_for_inference(target, batch=batch, context=context,
                                        bits=args.bits, max_memory=max_memory, offload_folder=args.offload_folder)
    console = Console(stderr=True)
    console.print(f"model: {target.describe()}")
    console.print(placement_table(loaded.placement))
    for note in loaded.placement.notes:
        console.print(f"note: {note}", highlight=False)
    for warning in loaded.placement.warnings():
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)
    sys.stderr.flush()
    return loaded, sampling


def check_devices(max_memory: dict | None) -> None:
    """A --max-memory GPU index this machine does not have is refused before loading (accelerate fails deep inside)."""
    from tuner.loading.model import ModelLoadError

    gpus = sorted(device for device in max_memory or {} if isinstance(device, int))
    if not gpus:
        return
    import torch

    count = torch.cuda.device_count()
    if gpus[-1] >= count:
        have = f"GPUs 0 to {count - 1}" if count else "no GPU"
        raise ModelLoadError(f"--max-memory {gpus[-1]}=...: this machine has {have}; budget the GPUs it has, or "
                             "only cpu=SIZE.")


def run_on_ranks(args: argparse.Namespace, command: Callable[[argparse.Namespace], int]) -> int:
    """``command(args)`` in this process, or with ``--tp N`` / ``--pp N`` on N ranks: checked and launched from here
    (rank 0's exit code), or run as one of them (rank 0 runs the command, the others follow its generate calls)."""
    if args.tp == 1 and args.pp == 1:
        return command(args)
    from tuner.infer.ranks import follow_rank, inference_rank, join_ranks, launch_ranks, release_ranks
    from tuner.infer.target import resolve_target

    rank = inference_rank()
    if rank is None:
        target = resolve_target(args.recipe, args.overrides, args.model, args.adapter)
        device_map_options = [flag for flag, given in (("--max-memory", args.max_memory),
                                                        ("--offload-folder", args.offload_folder)) if given]
        if args.pp > 1:
            from tuner.infer.pipeline_parallel import check_pipeline_parallel

            check_pipeline_parallel(target, args.pp, tp=args.tp, bits=args.bits, images=getattr(args, "image", ()),
                                    device_map_options=device_map_options)
        else:
            from tuner.infer.tensor_parallel import check_tensor_parallel

            check_tensor_parallel(target, args.tp, bits=args.bits, device_map_options=device_map_options)
        return launch_ranks(args.argv, args.tp * args.pp)
    join_ranks()
    if rank:
        follow_rank(resolve_target(args.recipe, args.overrides, args.model, args.adapter), args.tp, args.pp)
        return 0
    try:
        return command(args)
    finally:
        release_ranks()


def prompt_format_from_args(args: argparse.Namespace, loaded):
    """The prompt format of the run or recipe (from its training data), said on stderr when it changes a message."""
    from tuner.infer.prompt_format import PromptFormat, trained_prompt_format

    recipe = loaded.target.recipe
    if args.recipe is None:  # a bare --model: the schema's default data says nothing about it
        return PromptFormat(recipe.data.format, args.instruction)
    with libraries_to_log(loaded.target.run_dir, args.verbose):  # datasets' bars while the data is read
        found = trained_prompt_format(recipe, args.instruction)
    if found.note:
        change = " (--instruction TEXT to change)" if found.instruction and not args.instruction else ""
        print(f"prompt format: {found.note}{change}", file=sys.stderr)
    return found
