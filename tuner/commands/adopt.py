"""``tuner adopt DIR``: record the files of a folder an older tuner wrote (a run directory, a merged model, an export)
in its manifest, so tuner may replace them again; run it after looking through the folder, since from then on tuner
treats those files, as they are now, as its own."""
from __future__ import annotations

from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser("adopt", help="record an older tuner's run directory (or merged/export folder) as "
                                                 "tuner's, after you have looked through it")
    parser.add_argument("folder", metavar="DIR", help="the folder an older tuner wrote")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tuner.fileio import DestinationRefused
    from tuner.recipe.source import RecipeError
    from tuner.rundir.layout import MANIFEST
    from tuner.rundir.manifest import adopt

    folder = Path(args.folder)
    try:
        names = adopt(folder)
    except DestinationRefused as exc:
        raise RecipeError([str(exc)]) from None
    print(f"{folder / MANIFEST}: recorded {len(names)} files as tuner's ({', '.join(names) or 'none'})")
    return 0
