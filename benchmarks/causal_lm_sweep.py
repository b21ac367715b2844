"""Every causal-LM class of the installed transformers, planned as a new user would plan it: the class's default
config with its layers cut to four (``layer_types`` and every other per-layer setting cut with them), saved with
``save_pretrained``, then ``tuner plan --model DIR --gpus 1xH100-80GB --method full``.  Each class's result is its
plan's parameter total beside the count of the model transformers builds from the same folder on the meta device,
or the refusal (tuner's, or transformers' own when it cannot build its own defaults).

    python -m benchmarks.causal_lm_sweep --docs      # every class: rewrites the table in docs/memory.md
    python -m benchmarks.causal_lm_sweep qwen3 bamba  # only these model_types: their rows, printed
    python -m benchmarks.causal_lm_sweep --first-plan 3 bamba  # whole `tuner plan` processes, each from an empty
                                                             # $TUNER_HOME: median wall and CPU per model_type

``tests/test_causal_lm_sweep.py`` holds every class to its meta-built count or to a named refusal, and the table in
docs/memory.md to what this module computes.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

LAYERS = 4  # layers kept: enough for a hybrid's pattern of kinds to show, few enough to build in a second
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")  # transformers' names for the layer count
MAMBA2_HYBRIDS = ("bamba", "falcon_h1", "granitemoehybrid", "nemotron_h")  # issue 55: refused until configs decoded
DOCS_MARKER = "<!-- causal-lm sweep: python -m benchmarks.causal_lm_sweep -->"  # docs/memory.md's table follows


@dataclass(frozen=True)
class Swept:
    model_type: str
    result: str  # the plan's verdict ("fits", "cannot judge", ...), or "refused" / "not built"
    total: int | None  # the plan's parameter total
    meta_total: int | None  # what transformers builds from the same folder, tied weights once
    note: str  # why it was refused, or what the plan cannot judge
    seconds: float  # the first plan (the meta build of its inventory included)

    def row(self) -> str:
        total = f"{self.total:,}" if self.total is not None else "–"
        agrees = "" if self.total is None else (" (= meta)" if self.total == self.meta_total else
                                                f" (meta {self.meta_total:,})")
        return f"| `{self.model_type}` | {self.result} | {total}{agrees} | {self.note.replace('|', '/')} |"


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _layer_count(settings: dict) -> tuple[str, int] | None:
    for key in LAYER_KEYS:
        value = settings.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None


def _cut(value, layers: int):
    """A per-layer setting of ``layers`` layers cut to LAYERS: a list or a pattern string of one entry per layer,
    a list of layer indices or a mapping keyed by them (only the kept ones stay)."""
    if isinstance(value, (list, tuple)) and len(value) == layers:
        return type(value)(value[:LAYERS])
    if isinstance(value, str) and len(value) == layers and layers > LAYERS and " " not in value:
        return value[:LAYERS]  # nemotron_h's hybrid_override_pattern: "M-M-M*-..."
    if (isinstance(value, (list, tuple)) and value and len(value) < layers
            and all(isinstance(item, int) and not isinstance(item, bool) and 0 <= item < layers for item in value)):
        kept = [item for item in value if item < LAYERS]
        return type(value)(kept) if kept else value
    if isinstance(value, dict) and value and all(str(key).isdigit() and int(key) < layers for key in value):
        return {key: item for key, item in value.items() if int(key) < LAYERS}  # Gemma 4's per_layer_config
    return value


def cut_config(model_type: str):
    """transformers' default config of ``model_type`` with its language model cut to LAYERS layers: cut in the
    serialised settings (as config.json holds them: Gemma 4's per_layer_config is a mapping there) and rebuilt."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    text = config.get_text_config()
    data = config.to_dict()
    sub = next((key for key in config.sub_configs if getattr(config, key, None) is text), None)
    settings = data[sub] if sub is not None and text is not config else data
    found = _layer_count(settings)
    if found is None or found[1] <= LAYERS:
        return config
    key, layers = found
    for name, value in list(settings.items()):
        settings[name] = _cut(value, layers)
    settings[key] = LAYERS
    return type(config).from_dict(data)


def meta_total(folder: Path) -> int:
    """The parameters of the model transformers builds from ``folder`` on the meta device, tied weights once, with
    the auto class the config belongs to (an image-text default, such as llama4's with its vision_config, builds
    the whole image-text model)."""
    import torch
    import transformers
    from transformers import AutoConfig

    from tuner.catalog.model_classes import auto_class_for

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = getattr(transformers, auto_class_for(config.to_dict())).from_config(config)
    return sum(parameter.numel() for parameter in model.parameters())


def sweep_one(model_type: str, root: Path) -> Swept:
    """Save ``model_type``'s cut defaults under ``root`` and plan them (the first plan: nothing cached)."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.model_config import ModelConfigError
    from tuner.catalog.models import model_facts
    from tuner.planner import plan
    from tuner.recipe.io import validate_recipe

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    folder, note = root / model_type, ""
    try:
        cut_config(model_type).save_pretrained(folder)
        meta = meta_total(folder)
    except Exception as exc:  # a setting the cut does not know (Dory's layer split): the class's defaults, uncut
        note = f"layers not cut (transformers refuses the cut config: {_short(exc, 100)})"
        folder = root / f"{model_type}-uncut"
        try:
            CONFIG_MAPPING[model_type]().save_pretrained(folder)
            meta = meta_total(folder)
        except Exception as exc:  # transformers cannot build its own defaults: nothing for tuner to plan
            return Swept(model_type, "not built", None, None, f"transformers: {_short(exc)}", 0.0)
    model_facts.cache_clear()
    start = time.perf_counter()
    try:
        recipe = validate_recipe({"model": {"id": str(folder)}, "method": {"kind": "full"},
                                  "hardware": {"gpus_per_machine": 1, "gpu": "H100-80GB"}})
        planned = plan(recipe)
    except (UnknownModelError, ModelConfigError) as exc:
        return Swept(model_type, "refused", None, meta, _short(exc).replace(f"{folder}/config.json: ", ""),
                     time.perf_counter() - start)
    seconds = time.perf_counter() - start
    judged = ("cannot judge: " + "; ".join(planned.unmodelled)) if planned.unmodelled else ""
    return Swept(model_type, planned.verdict, planned.params["total"], meta, "; ".join(filter(None, (note, judged))),
                 seconds)


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def table(rows: list[Swept]) -> str:
    head = ["| class (`model_type`) | result | parameter total (plan vs meta-built) | note |", "|---|---|---|---|"]
    return "\n".join(head + [row.row() for row in rows]) + "\n"


def write_docs(rows: list[Swept]) -> None:
    """Replace the table after DOCS_MARKER in docs/memory.md with ``rows``'."""
    docs = Path(__file__).resolve().parents[1] / "docs" / "memory.md"
    text = docs.read_text()
    start = text.index(DOCS_MARKER) + len(DOCS_MARKER) + 1
    end = text.index("\n\n", start)
    docs.write_text(text[:start] + table(rows).rstrip("\n") + text[end:])


def first_plans(names: list[str], repeat: int) -> int:
    """``tuner plan --model DIR --gpus 1xH100-80GB --method full --json`` as whole processes from an empty
    $TUNER_HOME (imports, the meta build and the inventory's store included), interleaved; medians."""
    import os
    import shutil
    import tempfile

    from benchmarks.cli_startup import REPO, timed

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=str(root / "pycache"))
        argv = {name: [sys.executable, "-m", "tuner", "plan", "--model", str(root / name), "--gpus", "1xH100-80GB",
                       "--method", "full", "--json"] for name in names}
        for name in names:
            cut_config(name).save_pretrained(root / name)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        load_before = os.getloadavg()
        for attempt in range(repeat + 1):  # the first round writes the .pyc files and is not counted
            for name in names:
                shutil.rmtree(root / "home", ignore_errors=True)
                measured = timed(argv[name], {**env, "TUNER_HOME": str(root / "home")}, ok=(0, 1))
                if attempt:
                    runs[name].append(measured)
        load_after = os.getloadavg()
    for name, measured in runs.items():
        print(f"{name:<18} first plan median {statistics.median(w for w, _ in measured):.2f} s wall "
              f"(min {min(w for w, _ in measured):.2f}), {statistics.median(c for _, c in measured):.2f} s CPU")
    walls = [wall for measured in runs.values() for wall, _ in measured]
    print(f"all: median {statistics.median(walls):.2f} s wall; {repeat} runs each, interleaved; load average "
          f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in load_after)} after, "
          f"on {os.cpu_count()} cores")
    return 0


def main() -> int:
    import os
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", help="only these (default: every causal-LM class)")
    parser.add_argument("--docs", action="store_true", help="rewrite docs/memory.md's table (every class)")
    parser.add_argument("--first-plan", type=int, default=0, metavar="N",
                        help="time N whole first plans of each model_type (default: the Mamba-2 hybrids)")
    args = parser.parse_args()
    if args.first_plan:
        return first_plans(args.model_types or list(MAMBA2_HYBRIDS), args.first_plan)
    names = causal_lm_types() if args.docs or not args.model_types else args.model_types
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["TUNER_HOME"] = str(Path(scratch) / "home")  # nothing cached: every plan is a first plan
        rows = [sweep_one(name, Path(scratch)) for name in names]
    if args.docs:
        write_docs(rows)
    else:
        print(table(rows))
    planned = [row.seconds for row in rows if row.total is not None]
    if planned:
        print(f"{len(planned)} planned: first plan median {statistics.median(planned):.2f} s, "
              f"max {max(planned):.2f} s (in one process, imports paid once)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
