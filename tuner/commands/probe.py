"""``tuner probe RECIPE [--set k=v] [--steps N] [--force] [--tune-batch [--write [PATH]]]``: measure the recipe on this
machine — its own world, a few steps on worst-case batches, an evaluation and a save — beside the plan; with
``--tune-batch``, pick the micro-batch by measured tokens/s under a safety margin, keeping the effective batch.

Exit code 0 when the probe measured (and, with --tune-batch, found a micro-batch), 3 when a rank ran out of memory,
1 for another failure, 2 on bad input; a probe stopped by a signal exits 128 + N.
"""
from __future__ import annotations

import sys

from tuner.commands._recipe_args import add_recipe_arguments
from tuner.commands._types import at_least, fraction

EXIT_FAILED = 1
FORCE_HINT = "pass --force to probe anyway."


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "probe", help="measure the recipe on this machine (a few steps on worst-case batches) beside the plan")
    add_recipe_arguments(parser)
    parser.add_argument("--steps", type=at_least(1), default=None, metavar="N",
                        help="optimizer steps to measure (default 3: the first creates the optimizer states, the "
                             "others are timed)")
    parser.add_argument("--force", action="store_true", help="probe even if the plan does not fit")
    parser.add_argument("--tune-batch", action="store_true",
                        help="probe each micro-batch size the plan considers feasible (gradient accumulation keeps the "
                             "effective batch) and pick the fastest under the safety margin")
    parser.add_argument("--margin", type=fraction, default=None, metavar="FRACTION",
                        help="with --tune-batch: share of the device kept free (default 0.10, the planner's 'tight')")
    parser.add_argument("--max-probes", type=at_least(1), default=None, metavar="N",
                        help="with --tune-batch: launch at most N probes (default 4)")
    parser.add_argument("--write", nargs="?", const="", default=None, metavar="PATH",
                        help="with --tune-batch: write a copy of the recipe with the chosen values (default "
                             "RECIPE.tuned.yaml beside it; an existing file is never replaced)")
    parser.set_defaults(run=run)


def probe_and_report(recipe, *, steps: int | None, force: bool) -> int:
    """Probe ``recipe`` and print measured beside planned; the exit code."""
    from tuner.launch.probe import PROBE_STEPS, keep_results, launch_probe, report_lines
    from tuner.launch.run import RunRefused
    from tuner.recipe.source import RecipeError
    from tuner.rundir.events import Probe
    from tuner.train.oom import EXIT_OUT_OF_MEMORY

    memory_plan = planned(recipe)
    steps = steps or PROBE_STEPS
    print(f"probing {recipe.name} on this machine: {recipe.world_size} rank(s), {steps} optimizer step(s) on "
          f"worst-case batches of {recipe.training.micro_batch_size} x {recipe.training.max_seq_length} tokens "
          f"(x{recipe.training.gradient_accumulation_steps} accumulated), the largest evaluation batch and one save",
          file=sys.stderr)

    def said(notes):
        for note in notes:
            print(note, file=sys.stderr)

    def measured(events, _lines):
        for event in events:
            if isinstance(event, Probe):
                value = event.get("device_gib", event.get("peak_rss_gib"))
                print(f"  rank {event.rank}: {event.phase} measured, peak {value:.3f} GiB", file=sys.stderr)

    try:
        result = launch_probe(recipe, steps=steps, force=force, notes=said, on_update=measured)
    except RunRefused as exc:
        raise RecipeError([*exc.lines, FORCE_HINT]) from None
    path = keep_results(result, memory_plan)
    if result.status == "measured":
        print("\n".join(report_lines(result, memory_plan)))
        print(f"probe.json: {path}")
        return 0
    print("\n".join(result.lines), file=sys.stderr)
    print(f"probe.json: {path}", file=sys.stderr)
    if result.status == "stopped":
        return result.exit_code
    return EXIT_OUT_OF_MEMORY if (result.failure or {}).get("kind") == "out_of_memory" else EXIT_FAILED


def planned(recipe):
    from tuner.catalog.model_config import UnknownModelError
    from tuner.planner import plan
    from tuner.recipe.source import RecipeError

    try:
        return plan(recipe)
    except UnknownModelError as exc:
        raise RecipeError([f"{exc.field}: {exc}"]) from None


def run(args) -> int:
    from tuner.commands._recipe_args import recipe_from_args

    recipe = recipe_from_args(args)
    if not args.tune_batch:
        if args.write is not None or args.margin is not None or args.max_probes is not None:
            from tuner.recipe.source import RecipeError

            raise RecipeError(["--write, --margin and --max-probes go with --tune-batch."])
        return probe_and_report(recipe, steps=args.steps, force=args.force)
    return tune_and_report(recipe, args)


def tune_and_report(recipe, args) -> int:
    """--tune-batch: the search's table, the chosen values as --set lines and, with --write, a copy of the recipe."""
    import json
    import shlex
    from pathlib import Path

    from tuner.fileio import atomic_write_text
    from tuner.launch.batch_tuning import DEFAULT_MARGIN, MARGIN_REASON, MAX_PROBES, tune_batch
    from tuner.launch.probe import PROBE_STEPS
    from tuner.rundir.layout import PROBE_DIR, PROBE_REPORT
    from tuner.rundir.manifest import amend

    planned(recipe)  # a model the planner cannot read is one message, before any search
    margin = args.margin or DEFAULT_MARGIN
    if args.write is not None:
        destination = tuned_copy_path(args)  # refused before anything launches
    print(f"tuning the micro-batch of {recipe.name}: effective batch {recipe.effective_batch_size} "
          f"({recipe.training.micro_batch_size} x {recipe.training.gradient_accumulation_steps} accumulated per rank) "
          f"kept; safety margin {margin:.0%} of the device", file=sys.stderr)

    def launching(candidate):
        print(f"probing micro-batch {candidate.micro_batch_size} x {candidate.accumulation} accumulated "
              f"(plan {candidate.planned_gib:.3f} GiB) ...", file=sys.stderr)

    tuning = tune_batch(recipe, margin=margin, steps=args.steps or PROBE_STEPS,
                        max_probes=args.max_probes or MAX_PROBES, force=args.force, on_probe=launching)
    report = None
    if any(candidate.result is not None for candidate in tuning.candidates):  # the probes' folder exists
        report = atomic_write_text(Path(recipe.output.dir) / PROBE_DIR / PROBE_REPORT,
                                   json.dumps(tuning.report(), indent=2, default=str) + "\n")
        amend(report.parent, written=[PROBE_REPORT])
    print(f"{'micro-batch':>11}  {'accumulation':>12}  {'plan GiB':>8}  {'measured GiB':>12}  {'tokens/s':>9}  verdict")
    for c in tuning.candidates:
        measured = f"{c.measured_gib:.3f}" if c.measured_gib is not None else "—"
        speed = f"{c.tokens_per_s:,.0f}" if c.tokens_per_s is not None else "—"
        print(f"{c.micro_batch_size:>11}  {c.accumulation:>12}  {c.planned_gib:>8.3f}  {measured:>12}  {speed:>9}  "
              f"{c.verdict}")
    capacity = next((c.capacity_gib for c in tuning.candidates if c.capacity_gib), None)
    limit = f" ({capacity:.1f} GiB: at most {capacity * (1 - margin):.1f} GiB used)" if capacity else ""
    print(f"safety margin: {margin:.0%} of the device kept free{limit}, because {MARGIN_REASON}.")
    for note in tuning.notes:
        print(note, file=sys.stderr)
    if report is not None:
        print(f"probe.json: {report}")
    if tuning.stopped is not None:
        print("\n".join(tuning.stopped.lines), file=sys.stderr)
        return tuning.stopped.exit_code
    if tuning.chosen is None:
        print("no micro-batch size ran under the margin; see tuner plan RECIPE --advise for the tactics that free "
              "memory.", file=sys.stderr)
        return EXIT_FAILED
    sets = " ".join(f"--set {assignment}" for assignment in tuning.chosen.overrides)
    print(f"chosen: micro-batch {tuning.chosen.micro_batch_size} x {tuning.chosen.accumulation} accumulated "
          f"({tuning.chosen.tokens_per_s:,.0f} tokens/s); effective batch {tuning.chosen.recipe.effective_batch_size}")
    print(sets)
    if args.write is not None:
        write_tuned_copy(args, destination, tuning.chosen.overrides)
        print(f"wrote {destination} (tuner run {shlex.quote(str(destination))})")
    return 0


def tuned_copy_path(args):
    """Where --write puts the copy: the path given, or RECIPE.tuned.yaml beside the recipe file (in the current
    folder for a built-in recipe); an existing file is refused, never replaced."""
    from pathlib import Path

    from tuner.recipe.source import RecipeError

    if args.write:
        path = Path(args.write)
    else:
        given = Path(args.recipe)
        path = given.with_name(f"{given.stem}.tuned.yaml") if given.suffix in (".yaml", ".yml") else \
            Path(f"{given.name}.tuned.yaml")
    if path.exists() or path.is_symlink():
        raise RecipeError([_exists(path)])
    return path


def _exists(path) -> str:
    return f"--write: {path} exists; tuner never replaces it: give --write ANOTHER.yaml."


def write_tuned_copy(args, destination, overrides: list[str]) -> None:
    """The user's recipe as written (their keys and order, their --set lines applied) with the chosen values; the
    original's comments are not kept."""
    import yaml

    from tuner.fileio import create_exclusive_text
    from tuner.recipe.io import parse_yaml, read_recipe_text
    from tuner.recipe.overrides import apply_overrides
    from tuner.recipe.registry import resolve_recipe_argument
    from tuner.recipe.source import RecipeError, RecipeSource

    source_path = resolve_recipe_argument(args.recipe)
    data, _ = parse_yaml(read_recipe_text(source_path), str(source_path))
    data = apply_overrides(data, [*args.overrides, *overrides], RecipeSource())
    header = (f"# {args.recipe} with the micro-batch that tuner probe --tune-batch measured fastest on this machine\n"
              f"# ({', '.join(overrides)}); the original's comments are not kept.\n")
    try:
        create_exclusive_text(destination, header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    except FileExistsError:  # made since it was checked
        raise RecipeError([_exists(destination)]) from None
