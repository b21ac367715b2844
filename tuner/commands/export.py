"""``tuner export RUN --format gguf|ollama [--quant f16|bf16|q8_0]``: the run as a GGUF file for llama.cpp, and for
Ollama with a Modelfile beside it (``ollama create NAME -f ...`` is printed)."""
from __future__ import annotations

import sys
from pathlib import Path

from tuner.export import FORMATS, QUANT_NAMES
from tuner.rundir.library_output import VERBOSE_HELP


def register(subparsers) -> None:
    parser = subparsers.add_parser("export", help="write a run as a GGUF file for llama.cpp, or for Ollama with a Modelfile")
    parser.add_argument("run_dir", metavar="RUN", help="run directory (its final/ model; a LoRA adapter is merged "
                                                       "into its base first) or a saved model folder with -o")
    parser.add_argument("--format", choices=FORMATS, default="gguf",
                        help="gguf: the file alone; ollama: the file and a Modelfile (default gguf)")
    parser.add_argument("--quant", choices=QUANT_NAMES, default=None,
                        help="how weights are stored: f16, bf16 or q8_0 (default: bf16 for a bfloat16 model, else f16)")
    parser.add_argument("-o", "--output", metavar="DIR", help="folder to write (default: RUN/export/<quant>)")
    parser.add_argument("--check", action="store_true",
                        help="read the file back with transformers' GGUF loader and compare token ids and logits on "
                             "the run's held-out prompts before keeping it (loads the model twice)")
    parser.add_argument("--force", action="store_true",
                        help="replace an export tuner wrote there before (never a folder holding other files)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    parser.set_defaults(run=run)


def run(args) -> int:
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        print("error: tuner export needs the gguf package: pip install 'tuner[export]'", file=sys.stderr)
        return 1
    from tuner.export.exporter import export
    from tuner.infer.target import resolve_target
    from tuner.rundir.library_output import libraries_to_log

    target = resolve_target(args.run_dir, args.overrides)
    quant = args.quant or ("bf16" if target.recipe.model.dtype == "bfloat16" else "f16")
    with libraries_to_log(target.run_dir, args.verbose):  # loading bars while the model is read and written
        result = export(target, args.format, quant, Path(args.output) if args.output else None, args.force,
                        args.check)
    print(result.gguf_line)
    if result.check_line:
        print(result.check_line)
    if result.modelfile:
        print(f"Modelfile: {result.modelfile}")
        print(f"next: {result.ollama_create}")
    else:
        print(f"next: llama-cli -m {result.gguf_path} (or tuner export {args.run_dir} --format ollama)")
    return 0
