"""Nothing a library prints reaches the terminal under the wizard (tuner.tui.output): every way out of a process
(print, a logging handler or tqdm bar made before, a write to descriptor 1 or 2, a child process) ends in the log,
while ``sys.__stdout__``/``sys.__stderr__`` (what Textual draws on) stay the terminal."""
from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings, strategies as st

from conftest import REPO

WRITERS = {  # each prints its marker through one of the paths around Textual's sys.stdout redirection
    "print": "print('{m}')",
    "print_err": "print('{m}', file=sys.stderr)",
    "early_logging": "early.warning('{m}')",
    "early_tqdm_stream": "early_stream.write('{m}\\n'); early_stream.flush()",
    "fd1": "os.write(1, b'{m}\\n')",
    "fd2": "os.write(2, b'{m}\\n')",
    "child": "subprocess.run([sys.executable, '-c', 'import sys; print(\"{m}\"); print(\"{m}\", file=sys.stderr)'])",
    "tqdm": "list(tqdm.tqdm(range(3), desc='{m}'))",
    "warning": "warnings.warn('{m}')",
}
SCRIPT = """
import logging, os, subprocess, sys, warnings
import tqdm
early = logging.getLogger('early'); early.addHandler(logging.StreamHandler())  # holds the sys.stderr of before
early_stream = sys.stderr
from pathlib import Path
from tuner.tui.output import library_output_to
with library_output_to(Path(sys.argv[1])):
    sys.__stdout__.write('terminal-out\\n'); sys.__stdout__.flush()
    sys.__stderr__.write('terminal-err\\n'); sys.__stderr__.flush()
{body}
print('after')
"""


@settings(max_examples=12, deadline=None)
@given(st.lists(st.sampled_from(sorted(WRITERS)), min_size=1, max_size=4, unique=True))
def test_every_way_out_of_the_process_ends_in_the_log(tmp_path_factory, writers):
    log = tmp_path_factory.mktemp("out") / "tui.log"
    body = "\n".join(f"    {WRITERS[name].format(m=f'marker-{name}')}" for name in writers)
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(body=body), str(log)], capture_output=True, text=True,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "marker-" not in done.stdout + done.stderr  # the terminal saw none of it
    assert done.stdout == "terminal-out\nafter\n" and done.stderr == "terminal-err\n"
    logged = log.read_text()
    for name in writers:
        assert f"marker-{name}" in logged
