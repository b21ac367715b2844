"""How close ``tuner infer`` comes to a plain transformers script: whole processes on the demo model, on the CPU.

    python benchmarks/infer_speed.py [--repeat N] [--max-new-tokens T]

Target (issue 17): a ``tuner infer --model DEMO --prompt ... --greedy`` process takes at most 1.02x the time of a
hand-written script that loads the same checkpoint with ``AutoModelForCausalLM.from_pretrained(dtype="auto")``
and calls ``generate`` on the same prompt. The two run interleaved (tuner, plain, tuner, plain, ...), so a busy
moment of a shared machine hits both alike; the ratio is taken pair by pair and its median printed, beside each
side's median wall time and the tokens/s line tuner prints. Both must give the same answer (checked).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.02
PROMPT = "reverse\nthe quick brown fox jumps over the lazy dog"

PLAIN = """
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

path, prompt, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
model.eval()
text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
with torch.no_grad():
    output = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed:\n{result.stderr[-2000:]}")
    return elapsed, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    options = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tuner.loading.demo_model import builtin_model_path

    model = str(builtin_model_path("builtin:demo"))
    new_tokens = str(options.max_new_tokens)
    tuner = [sys.executable, "-m", "tuner", "infer", "--model", model, "--prompt", PROMPT, "--greedy",
             "--max-new-tokens", new_tokens]
    plain = [sys.executable, "-c", PLAIN, model, PROMPT, new_tokens]
    with tempfile.TemporaryDirectory() as pycache:  # bytecode as an installed package has it (see cli_startup.py)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=pycache, HF_HUB_OFFLINE="1")
        _, first = timed(tuner, env)  # warm the file cache and write the .pyc files
        _, reference = timed(plain, env)
        if first.stdout != reference.stdout:
            raise SystemExit(f"the answers differ: tuner {first.stdout!r}, plain {reference.stdout!r}")
        load_before = os.getloadavg()
        pairs, speed_lines = [], []
        for _ in range(options.repeat):
            tuner_s, result = timed(tuner, env)
            plain_s, _ = timed(plain, env)
            pairs.append((tuner_s, plain_s))
            speed_lines.append(next(line for line in result.stderr.splitlines() if line.endswith("tokens/s")))
        load_after = os.getloadavg()
    ratio = statistics.median(t / p for t, p in pairs)
    print(f"answer ({len(first.stdout.strip())} characters): {first.stdout.strip()!r}")
    print(f"tuner infer      median {statistics.median(t for t, _ in pairs):.3f} s (whole process)")
    print(f"plain generate   median {statistics.median(p for _, p in pairs):.3f} s (whole process)")
    print(f"ratio tuner/plain, pair by pair: median {ratio:.3f} (min {min(t / p for t, p in pairs):.3f}, "
          f"max {max(t / p for t, p in pairs):.3f})   target {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'}")
    print(f"tuner's own speed line (last run): {speed_lines[-1]}")
    print(f"{options.repeat} pairs, interleaved; load average {' '.join(f'{x:.2f}' for x in load_before)} before, "
          f"{' '.join(f'{x:.2f}' for x in load_after)} after, on {os.cpu_count()} cores")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
