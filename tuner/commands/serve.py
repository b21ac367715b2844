"""``tuner serve RUN|RECIPE|--model M [--adapter A]``: an OpenAI-compatible server on localhost (transformers'
``transformers serve``), in the run's prompt format, after printing where the model was placed.
``--print vllm`` prints instead the ``vllm serve`` command for GPUs, sized from the inference plan."""
from __future__ import annotations

import shlex
import sys

from tuner.commands._recipe_args import add_recipe_arguments
from tuner.commands._types import at_least, gpus, host, recipe_field


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve a trained run or a model over an OpenAI-compatible HTTP API (chat completions, streaming)")
    add_recipe_arguments(parser, required=False,
                         help="a tuner run directory (runs/<name>), a recipe, or a built-in recipe name")
    parser.add_argument("--model", metavar="PATH_OR_ID", help="model directory or hub id (replaces the recipe's model)")
    parser.add_argument("--adapter", metavar="DIR", help="LoRA adapter folder or tuner run directory to apply")
    parser.add_argument("--host", default="127.0.0.1", type=host,
                        help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=recipe_field("hardware.main_process_port"), default=8000,
                        help="port to listen on (default: 8000)")
    parser.add_argument("--bits", type=int, choices=(4, 8), help="quantise the weights with bitsandbytes while loading")
    parser.add_argument("--context", type=at_least(1), metavar="TOKENS",
                        help="longest conversation planned for (default: training.max_seq_length + inference.max_new_tokens)")
    parser.add_argument("--request-timeout", type=at_least(1), default=60, metavar="SECONDS",
                        help="longest one request may generate before its answer is cut (default: 60); the others "
                             "wait at most that long for it")
    parser.add_argument("--print", dest="print_command", choices=("vllm",),
                        help="print the `vllm serve` command for this model instead of serving it here")
    parser.add_argument("--gpus", metavar="NxGPU", type=gpus,
                        help="with --print vllm: the GPUs of the serving machine, e.g. 8xH100-80GB "
                             "(default: the recipe's hardware)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tuner.infer.target import resolve_target
    from tuner.recipe.warnings import recipe_warnings

    target = resolve_target(args.recipe, args.overrides, args.model, args.adapter)
    for warning in recipe_warnings(target.recipe):  # before loading: remote code runs while the model loads
        print(f"warning: {warning}", file=sys.stderr)
    if args.print_command == "vllm":
        return print_vllm(args, target)
    return serve(args, target)


def serve(args, target) -> int:
    from rich.console import Console

    from tuner.infer.load import default_context, planner_facts
    from tuner.infer.placement import placement_table
    from tuner.infer.serve import Server, check_port_free, require_server, serving_folder

    require_server()
    check_port_free(args.host, args.port)
    served = serving_folder(target)
    console = Console(stderr=True)
    console.print(f"model: {served.target.describe()}", highlight=False)
    if served.wrote_chat_template:
        console.print(f"prompt format: {served.target.recipe.data.format} (the tokenizer has no chat template; "
                      f"wrote the one tuner trains with into {served.path})", highlight=False)
    server = Server(served, args.host, args.port, args.bits, args.request_timeout)
    if server.dtype_note:
        console.print(f"note: {server.dtype_note}", highlight=False)
    context = args.context or default_context(served.target, served.target.recipe.inference.max_new_tokens)
    placement = server.placement(context, planner_facts(served.target))
    console.print(placement_table(placement))
    for warning in placement.warnings():
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)
    limit = server.limits.context
    print(f"serving at {server.url} as model {served.model_name!r} "
          "(OpenAI chat completions, streaming too; Ctrl-C stops)", flush=True)
    if limit:
        print(f"limits: prompt and answer within the model's context of {limit} tokens; "
              f"{args.request_timeout} s of generation per request", file=sys.stderr, flush=True)
    server.run()
    return 0


def serving_gpus(args, recipe) -> tuple[int, str, float]:
    """GPUs per machine, their name and GiB: ``--gpus``, else the recipe's hardware."""
    from tuner.catalog.gpus import lookup_gpu
    from tuner.recipe.source import RecipeError

    hardware = recipe.hardware
    count, name = args.gpus or (hardware.gpus_per_machine, hardware.gpu)
    if not args.gpus and hardware.gpu_memory_gb:
        return count, name or f"{hardware.gpu_memory_gb:g}GB", hardware.gpu_memory_gb
    if name is None:
        if count < 1:
            return 0, "GPU", 0.0  # the plan says vLLM needs GPUs
        raise RecipeError(["hardware.gpu: vLLM's plan needs the GPU type or size; set hardware.gpu (or "
                           "hardware.gpu_memory_gb), or pass --gpus, e.g. --gpus 2xA100-80GB."])
    try:
        spec = lookup_gpu(name)
    except KeyError:
        raise RecipeError([f"{'--gpus' if args.gpus else 'hardware.gpu'}: unknown GPU {name!r}; use a catalog name "
                           "(tuner plan --help) or a size such as 48GB."]) from None
    return count, spec.name, spec.memory_gib


def print_vllm(args, target) -> int:
    from tuner.data.formats import chat_template_for
    from tuner.infer.load import default_context, planner_facts
    from tuner.infer.serve import check_serving_folder, merged_if_any, write_chat_template
    from tuner.infer.vllm import VllmPlanError, adapter_modules_to_save, plan_vllm, vllm_serve_argv
    from tuner.loading.model import ModelLoadError, load_tokenizer, refuse_custom_code
    from tuner.recipe.source import RecipeError
    from tuner.rundir.layout import SERVE_DIR
    from tuner.rundir.lock import RunLock

    target = merged_if_any(target)
    recipe = target.recipe
    for source in dict.fromkeys((target.model_path, target.tokenizer_path)):  # vLLM would run the code it ships
        refuse_custom_code(recipe, source)
    facts = planner_facts(target)
    if facts is None:
        raise ModelLoadError(f"{target.model_path}: no architecture facts to plan vLLM with (not in tuner's catalog "
                             "nor a local folder with config.json).")
    if target.adapter is not None and adapter_modules_to_save(target.adapter):
        raise ModelLoadError(f"{target.adapter}: the adapter also trains whole modules (modules_to_save), which vLLM's "
                             f"LoRA serving does not load; merge it first (tuner merge {target.run_dir or 'RUN'}) and "
                             "print the command again: the merged model is served.")
    gpus, gpu_name, capacity = serving_gpus(args, recipe)
    lora = recipe.method.lora
    try:
        plan = plan_vllm(facts, recipe.model.dtype, gpus, gpu_name, capacity, recipe.inference.gpu_headroom_gb,
                         args.context or default_context(target, recipe.inference.max_new_tokens),
                         facts.lora_params(lora.r, lora.target_modules) if target.adapter else 0)
    except VllmPlanError as exc:
        raise RecipeError([str(exc)]) from None
    try:
        tokenizer = load_tokenizer(recipe, target.tokenizer_path)
    except ModelLoadError:  # planning away from the weights: vLLM reads the model's own template where it runs
        tokenizer = None
        print(f"note: {target.tokenizer_path} is not on this machine, so its chat template was not checked",
              file=sys.stderr)
    chat_template = None
    if tokenizer is not None and not tokenizer.chat_template:  # the run's prompt format, as vLLM takes it
        if target.run_dir is not None:  # a file beside the run, or the template itself in single-line form
            with RunLock(target.run_dir):
                check_serving_folder(target.run_dir / SERVE_DIR)
                chat_template = str(write_chat_template(target.run_dir / SERVE_DIR, tokenizer, recipe.data.format))
        else:
            text = chat_template_for(tokenizer, recipe.data.format)
            chat_template = text.replace("\\", "\\\\").replace("\n", "\\n")
    argv = vllm_serve_argv(
        target.model_path, plan, recipe.model.dtype, args.host, args.port, served_name=recipe.name,
        tokenizer=target.tokenizer_path if target.tokenizer_path != target.model_path else None,
        chat_template=chat_template,
        lora=(recipe.name, str(target.adapter), lora.r) if target.adapter else None,
        trust_remote_code=recipe.model.trust_remote_code)
    for line in plan.lines():
        print(line, file=sys.stderr)
    print(f"clients ask for model {recipe.name!r}", file=sys.stderr)
    print(shlex.join(argv))
    return 0
