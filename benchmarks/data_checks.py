"""How fast and how small the data checks are: ``check_data`` on 200,000 JSONL and CSV rows, and a 100 MB row.

Targets (issue 14): every row checked before launch in seconds for a few hundred thousand rows; a 100 MB row
refused with its line without the process growing by more than the 8 MiB a row may hold (plus the runtime).
Run: python benchmarks/data_checks.py   (prints one line per measurement; results in benchmarks/results/)
"""
from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROWS = 200_000


def main() -> None:
    from tuner.data.prepare import check_data
    from tuner.data.sources import DataError
    from tuner.recipe.io import validate_recipe

    with tempfile.TemporaryDirectory() as tmp:
        jsonl, csv_file, huge = Path(tmp) / "rows.jsonl", Path(tmp) / "rows.csv", Path(tmp) / "huge.jsonl"
        with open(jsonl, "w") as stream:
            for i in range(ROWS):
                stream.write(json.dumps({"instruction": f"reverse the words {i} " * 3, "output": "x y z " * 10}) + "\n")
        with open(csv_file, "w") as stream:
            stream.write("instruction,output\n")
            stream.writelines(f'"reverse, {i}",out {i}\n' for i in range(ROWS))
        with open(huge, "wb") as stream:  # written in 1 MiB pieces: the peak below is the check's alone
            stream.write(b'{"text": "ok"}\n{"text": "')
            for _ in range(100):
                stream.write(b"x" * 2**20)
            stream.write(b'"}\n')
        import datasets  # noqa: F401  (imported by the check; its own size is not the check's)

        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        try:
            check_data(validate_recipe({"data": {"source": str(huge), "eval_fraction": 0}}))
        except DataError as exc:
            message = str(exc)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(f"a 100 MB row: refused in {time.perf_counter() - start:.2f} s, peak RSS grew {grown:.0f} MiB: "
              f"{message[:90]}...")
        for path in (jsonl, csv_file):
            recipe = validate_recipe({"data": {"source": str(path), "eval_fraction": 0.1}})
            for attempt in ("first (datasets builds its cache)", "again (cache warm)"):
                start = time.perf_counter()
                check_data(recipe)
                print(f"check_data, {ROWS} {path.suffix} rows, {attempt}: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
