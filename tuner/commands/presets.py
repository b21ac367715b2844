"""``tuner presets ls | cp [DIR] [--force]``: ready Accelerate configs (single GPU, DDP, ZeRO-1/2/3, ZeRO-3 offload,
FSDP) for your own training scripts.

``cp`` renders them into DIR (default ``accelerate_configs``, as the repository ships them), never over an existing
file without ``--force``, nor ever over one the folder's manifest (``tuner_files.json``) does not prove tuner wrote; the
DeepSpeed presets name their JSON by the path written, so launch from the folder ``cp`` ran in (or give an absolute
DIR).
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser("presets", help="list or write ready Accelerate configs for your own scripts")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("ls", help="list the presets and when to use each").set_defaults(run=run_ls)
    copy = actions.add_parser("cp", help="write every preset into a folder")
    copy.add_argument("dest", nargs="?", default=None, help="folder to write them to (default: accelerate_configs)")
    copy.add_argument("--force", action="store_true", help="overwrite presets already there")
    copy.set_defaults(run=run_cp)


def run_ls(args) -> int:
    from tuner.render.presets import PRESETS

    width = max(len(str(name)) for name in PRESETS)
    for name, (when, _, _) in PRESETS.items():
        print(f"{str(name):<{width}}  {when}")
    print("\nwrite them with: tuner presets cp [DIR]")
    return 0


def run_cp(args) -> int:
    from tuner.fileio import atomic_write_text
    from tuner.recipe.source import RecipeError
    from tuner.render.presets import PRESETS_DIR, render_presets
    from tuner.rundir.layout import MANIFEST
    from tuner.rundir.manifest import proved, read_manifest, text_record, write_manifest

    directory = args.dest or PRESETS_DIR
    files = render_presets(directory.rstrip("/") or "/")
    ours = proved(Path(directory)) if Path(directory).is_dir() else {}
    existing = [name for name in files if os.path.lexists(Path(directory, name))]
    foreign = [name for name in existing if name not in ours]
    if os.path.lexists(Path(directory, MANIFEST)) and read_manifest(Path(directory)) is None:
        foreign.append(MANIFEST)  # not a manifest of this tuner's: the user's file, never replaced
    if foreign:
        raise RecipeError([f"{directory}: {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}: not written "
                           f"by tuner, or changed since (its {MANIFEST} there does not prove them tuner's); tuner will "
                           "not replace them, even with --force. Move them away, or choose another folder."])
    if existing and not args.force:
        raise RecipeError([f"{directory}: already holds {len(existing)} of the presets' {len(files)} files "
                           f"({Path(directory, existing[0])}, ...); pass --force to overwrite them, or choose another "
                           "folder."])
    for name, text in files.items():
        atomic_write_text(Path(directory, name), text)
    write_manifest(Path(directory), {**ours, **{name: text_record(text) for name, text in files.items()}},
                   "tuner presets cp")
    where = "" if Path(directory).is_absolute() else f" (their DeepSpeed paths are relative to {Path.cwd()})"
    example = shlex.join(["accelerate", "launch", "--config_file", str(Path(directory, "zero2.yaml")), "your_script.py"])
    print(f"wrote {len(files)} files to {directory}{where}; e.g. {example}")
    return 0
