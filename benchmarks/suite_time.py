"""Where the test suite's time goes: a pytest JUnit report (``--junitxml``) summed per file, with the slowest tests.

The suite's goal (issue 53): ``make test`` under 20 minutes on an idle 2-core machine from a fresh clone, whose
``$TUNER_HOME`` is empty (every built model, prepared dataset and kept hub config built by the suite's first user).
Run the suite as CI does, with an empty home, then summarise it:

    HOME=$(mktemp -d) TUNER_TEST_HOME=$(mktemp -d) .venv/bin/python -m pytest -q -n 2 --dist loadgroup \\
        --junitxml=/tmp/suite.xml
    python benchmarks/suite_time.py /tmp/suite.xml > benchmarks/results/suite-time_<date>_cpu.md
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict

SLOWEST = 30


def summary(report_path: str) -> str:
    suite = ElementTree.parse(report_path).getroot().find("testsuite")
    cases = [(case.get("classname", ""), case.get("name", ""), float(case.get("time", 0))) for case in suite]
    per_file: dict[str, float] = defaultdict(float)
    for module, _, seconds in cases:
        per_file[module.replace(".", "/") + ".py"] += seconds
    total = sum(seconds for _, _, seconds in cases)
    lines = [f"# The suite's time ({suite.get('timestamp', '')[:10]})", "",
             f"{suite.get('tests')} tests ({suite.get('failures')} failed, {suite.get('skipped')} skipped), "
             f"wall {float(suite.get('time')):.0f} s; the tests' own times sum to {total:.0f} s (setup, call and "
             f"teardown, over every worker).", "", "| file | seconds | share |", "|---|---:|---:|"]
    for path, seconds in sorted(per_file.items(), key=lambda item: -item[1])[:SLOWEST]:
        lines.append(f"| {path} | {seconds:.0f} | {seconds / total:.1%} |")
    lines += ["", f"The {SLOWEST} slowest tests:", "", "| test | seconds |", "|---|---:|"]
    for module, name, seconds in sorted(cases, key=lambda case: -case[2])[:SLOWEST]:
        lines.append(f"| {module.removeprefix('tests.')}::{name} | {seconds:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(summary(sys.argv[1]), end="")
