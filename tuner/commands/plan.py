"""``tuner plan``: predict peak memory per device; ``--advise`` for the cheapest plan that fits.

A recipe (``tuner plan RECIPE --set ...``) or ad hoc flags (``tuner plan --model ID --gpus 8xA100-80GB
--seq 4096 --batch 2 --method lora``); the flags are recipe overrides, so both paths validate alike.
Exit code 0 when the plan (or, with --advise, the best advice) fits, 1 when nothing fits, 2 on bad input.
"""
from __future__ import annotations

from tuner.catalog.demo import DEMO_MODEL_ID
from tuner.commands._recipe_args import add_recipe_arguments
from tuner.commands._types import gpus, recipe_field

EXIT_DOES_NOT_FIT = 1


def register(subparsers) -> None:
    parser = subparsers.add_parser("plan", help="predict GPU memory per device; --advise finds the cheapest plan that fits")
    add_recipe_arguments(parser, required=False)
    adhoc = parser.add_argument_group("ad hoc planning (each flag is a recipe override)")
    adhoc.add_argument("--model", help=f"model.id: hub id, local directory or {DEMO_MODEL_ID}")
    adhoc.add_argument("--gpus", type=gpus, help="hardware: N x GPU type, e.g. 8xA100-80GB, 1xRTX4090 or 2x48GB")
    adhoc.add_argument("--seq", type=recipe_field("training.max_seq_length"), help="training.max_seq_length")
    adhoc.add_argument("--batch", type=recipe_field("training.micro_batch_size"), help="training.micro_batch_size")
    adhoc.add_argument("--method", choices=("full", "lora", "qlora"), help="method.kind (qlora: 4-bit NF4)")
    adhoc.add_argument("--gradient-checkpointing", action="store_true", help="memory.gradient_checkpointing: true")
    adhoc.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="DeepSpeed ZeRO stage (memory.zero_stage)")
    parser.add_argument("--advise", action="store_true", help="search the ladder of memory tactics for plans that fit")
    parser.add_argument("--simulate", action="store_true",
                        help="also trace one real training step on fake tensors (no memory used) and compare")
    parser.add_argument("--json", action="store_true", help="print stable JSON (units named) instead of tables")
    parser.set_defaults(run=run)


def adhoc_overrides(args) -> list[str]:
    """The ad hoc flags as ``--set`` style overrides."""
    sets = []
    if args.model:
        sets.append(f"model.id={args.model}")
    if args.gpus:
        count, gpu = args.gpus
        sets += [f"hardware.gpus_per_machine={count}", f"hardware.gpu={gpu}", "hardware.num_processes=null"]
        if count > 1 and args.zero is None:
            sets.append("memory.distributed=ddp")
    if args.seq:
        sets.append(f"training.max_seq_length={args.seq}")
    if args.batch:
        sets.append(f"training.micro_batch_size={args.batch}")
    if args.method:
        sets.append(f"method.kind={args.method}")
        sets.append("method.quantization={bits: 4}" if args.method == "qlora" else "method.quantization=null")
        sets.append(f"output.save={'full' if args.method == 'full' else 'adapter'}")
    if args.gradient_checkpointing:
        sets.append("memory.gradient_checkpointing=true")
    if args.zero is not None:
        sets += ["memory.distributed=deepspeed", f"memory.zero_stage={args.zero}"]
    return sets


def load_plan_recipe(args):
    from tuner.recipe.io import load_recipe, validate_recipe
    from tuner.recipe.overrides import apply_overrides
    from tuner.recipe.registry import resolve_recipe_argument
    from tuner.recipe.source import RecipeError, RecipeSource

    overrides = adhoc_overrides(args) + list(args.overrides)
    if args.recipe:
        return load_recipe(resolve_recipe_argument(args.recipe), overrides)
    if not args.model:
        raise RecipeError(["tuner plan needs a recipe (tuner plan RECIPE) or a model (tuner plan --model ID --gpus 1xA100-80GB)."])
    if args.method in ("lora", "qlora") and _adapts_fused_experts(args.model) and not any(
            o.startswith(("method.lora.dropout=", "method.lora.target_modules=")) for o in args.overrides):
        overrides.append("method.lora.dropout=0")  # all-linear adapts fused experts, which PEFT runs only without it
    source = RecipeSource()
    return validate_recipe(apply_overrides({}, overrides, source), source)


def _adapts_fused_experts(model_id: str) -> bool:
    """Whether all-linear makes PEFT adapt the model's fused experts as parameters (lora.ParamWrapper)."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    try:
        return model_facts(model_id).adapts_parameters("all-linear")
    except UnknownModelError:
        return False  # validation names what is wrong with the model


def run(args) -> int:
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.hub import HubError
    from tuner.recipe.source import RecipeError

    from tuner.commands._recipe_args import say_warnings

    recipe = load_plan_recipe(args)
    say_warnings(recipe)  # planning builds the model's classes: its own code, with trust_remote_code, runs then
    try:
        from tuner.planner import advise, plan

        memory_plan = plan(recipe)
        advice = advise(recipe) if args.advise else None
        more_gpus = alternative_topology(recipe, advice)
    except HubError:  # the hub was asked and could not answer: the environment, not the recipe (exit 1)
        raise
    except UnknownModelError as exc:
        raise RecipeError([f"{exc.field}: {exc}"]) from None
    simulation = None
    if args.simulate and recipe.objective.grpo is not None:  # a round: generation and the training step
        from tuner.loading.simulate import simulate_grpo

        simulation = simulate_grpo(recipe)
    elif args.simulate:
        from tuner.loading.simulate import simulate

        simulation = simulate(recipe)
    from tuner.planner.measured import measured_record

    measured = measured_record(recipe)  # a probe of this setup on this machine, shown beside the plan
    if args.json:
        import json

        data = memory_plan.to_dict()
        if measured is not None:
            data["measured_on_this_machine"] = {**measured.__dict__, "line": measured.line(memory_plan.gpu.total_gib)}
        if advice is not None:
            data = {"plan": data, "advice": [_advice_dict(a) for a in advice],
                    "topology": _advice_dict(more_gpus) if more_gpus else None}
        if simulation is not None:
            data = {**({"plan": data} if "plan" not in data else data),
                    "simulation": {**simulation.to_dict(), "planned_gib": round(simulated_step_gib(memory_plan), 4)}}
        print(json.dumps(data, indent=2))
    else:
        from rich.console import Console

        from tuner.catalog.models import model_facts

        console = Console()
        print_plan(console, memory_plan)
        model = recipe.model  # where the architecture came from: catalog, local config, hub (fetched or kept), cache
        console.print(f"architecture: {model_facts(model.id, model.revision, model.trust_remote_code).source}",
                      style="dim", highlight=False)
        if measured is not None:
            console.print(measured.line(memory_plan.gpu.total_gib), style="bold", markup=False, highlight=False)
        if simulation is not None:
            print_simulation(console, simulation, memory_plan)
        if advice is not None:
            print_advice(console, advice, more_gpus)
    fits = advice[0].fits if advice else memory_plan.fits
    return 0 if fits else EXIT_DOES_NOT_FIT


def alternative_topology(recipe, advice):
    """Where the best advice offloads (or nothing fits), the fewest GPUs of the recipe's type that need no offload."""
    from tuner.planner.topology import topology, uses_offload

    if not advice or (advice[0].fits and not uses_offload(advice[0].recipe)):
        return None
    return topology(recipe)


def _advice_dict(advice) -> dict:
    return {"fits": advice.fits, "cost": round(advice.cost, 3), "changes": advice.changes, "reasons": advice.reasons,
            "set": advice.overrides, "largest_micro_batch": advice.largest_micro_batch,
            "gradient_accumulation_for_largest": advice.accumulation_for_largest, "plan": advice.plan.to_dict()}


_VERDICT_STYLE = {"fits": "bold green", "tight": "bold yellow", "does not fit": "bold red", "unknown": "bold",
                  "cannot judge": "bold magenta"}


def print_plan(console, memory_plan) -> None:
    from rich.table import Table

    params = memory_plan.params
    console.print(f"[bold]{memory_plan.model}[/]: {params['total'] / 1e9:.3f} B parameters, "
                  f"{memory_plan.trainable_params / 1e6:,.1f} M trainable; micro-batch {memory_plan.micro_batch_size} "
                  f"x {memory_plan.max_seq_length} tokens")
    for device in memory_plan.devices:
        during = device.moment if device.phase == device.moment else f"the {device.moment} of a {device.phase}"
        table = Table(title=f"{device.name} — peak during {during}", title_justify="left")
        table.add_column("term")
        table.add_column("item")
        table.add_column("GiB", justify="right")
        for item in device.live_items:
            table.add_row(item.category, item.name, f"{item.gib:.2f}")
        table.add_section()
        if device.kind == "gpu":  # the three figures torch and nvidia-smi report
            table.add_row("allocated", "live tensors (torch.cuda.max_memory_allocated)", f"{device.allocated_gib:.2f}")
            table.add_row("reserved", "+ allocator cache (torch.cuda.max_memory_reserved)", f"{device.reserved_gib:.2f}")
            table.add_row("device", "+ CUDA context, NCCL (nvidia-smi)", f"[bold]{device.total_gib:.2f}[/]")
        else:
            table.add_row("total", "", f"[bold]{device.total_gib:.2f}[/]")
        if device.capacity_gib is not None:
            table.add_row("capacity", "", f"{device.capacity_gib:.2f}")
            table.add_row("headroom", "", f"{device.headroom_gib:.2f}")
        console.print(table)
        console.print("phases: " + " · ".join(f"{phase} {device.phase_gib(phase):.2f}" for phase in device.phases)
                      + " GiB", style="dim")
    style = _VERDICT_STYLE.get(memory_plan.verdict, "bold")
    missing = f": {memory_plan.missing_gib:.2f} GiB missing" if memory_plan.missing_gib > 0 else ""
    limiting = memory_plan.limiting
    console.print(f"verdict: [{style}]{memory_plan.verdict}[/]{missing} (highest: {limiting.name} while "
                  f"{limiting.moment}, {limiting.total_gib:.2f} GiB)")
    for note in memory_plan.notes:
        console.print(f"[dim]note: {note}[/]")


def print_advice(console, advice, more_gpus=None) -> None:
    console.print()
    if not advice[0].fits:
        console.print(f"[bold red]{advice[0].reasons[0]}[/]")
        print_topology(console, more_gpus)
        return
    console.print("[bold]plans that fit, cheapest first[/] (cost = estimated throughput penalty):")
    for rank, item in enumerate(advice, 1):
        console.print(f"{rank}. {item.summary()} [{_VERDICT_STYLE[item.plan.verdict]}]{item.plan.verdict}[/]")
        for line in item.reasons:
            console.print(f"     - {line}")
        if item.overrides:
            console.print("     [dim]" + " ".join(f"--set {c}" for c in item.overrides) + "[/]")
    best = advice[0]
    if best.largest_micro_batch:
        console.print(f"largest micro-batch that fits plan 1: {best.largest_micro_batch} "
                      f"(gradient_accumulation_steps {best.accumulation_for_largest} keeps the effective batch)")
    print_topology(console, more_gpus)


def print_topology(console, more_gpus) -> None:
    """The fewest GPUs without offload, beside plans that offload."""
    if more_gpus is None:
        return
    console.print(f"[bold]with more GPUs instead of offload[/]: {more_gpus.reasons[0]} (~{more_gpus.cost:.0%} slower "
                  "than the recipe on those GPUs)")
    for line in more_gpus.reasons[1:]:
        console.print(f"     - {line}")
    console.print("     [dim]" + " ".join(f"--set {c}" for c in more_gpus.overrides) + "[/]")


def simulated_step_gib(memory_plan) -> float:
    """What a fake-tensor trace of one step sees of the plan: the training step's live tensors."""
    from tuner.planner.items import TRAINING_STEP

    return memory_plan.gpu.phase_gib(TRAINING_STEP, ("allocated",))


def print_simulation(console, simulation, memory_plan) -> None:
    console.print()
    if simulation.error:
        console.print(f"[yellow]simulation not possible: {simulation.error}[/]")
        return
    from rich.table import Table

    table = Table(title=f"simulated step on fake tensors ({simulation.seconds:.1f} s)", title_justify="left")
    table.add_column("category")
    table.add_column("GiB at peak", justify="right")
    for category, gib in simulation.peak_by_category.items():
        table.add_row(category, f"{gib:.3f}")
    table.add_section()
    table.add_row("simulated peak", f"{simulation.peak_gib:.3f}")
    table.add_row("analytic, allocated in the training step", f"{simulated_step_gib(memory_plan):.3f}")
    for phase, gib in simulation.phases_gib.items():  # grpo: each traced phase beside the plan's
        table.add_row(f"{phase}: simulated / analytic allocated",
                      f"{gib:.3f} / {memory_plan.gpu.phase_gib(phase, ('allocated',)):.3f}")
    console.print(table)
    for note in simulation.notes:
        console.print(f"[dim]note: {note}[/]")
