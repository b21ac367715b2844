"""How data preparation grows with the data: tuner's ``prepare_data`` against a plain ``datasets`` pipeline.

    python benchmarks/data_prep.py [--sizes 10000 100000 1000000] [--formats text instruction chat]
                                   [--files jsonl parquet] [--big 1000000 --big-cases text.jsonl ...]

For each size, format and file type (JSON lines or Parquet) a file is generated; each side then runs in its own
process with an empty datasets cache and an empty tuner home, so both convert the file to Arrow once, as a first
run does.  The cases run size by size, the two sides of a case one after the other (plain first):

- tuner: ``prepare_data(recipe, tokenizer)``: every row checked (file:line messages), shuffled with the seed,
  5% held out, tokenised with loss masks, truncated to 128 tokens, rows with nothing to learn dropped, and the
  result cached; then the same call again, which reuses the cache (what a re-run or a resume costs);
- plain: ``load_dataset("json"/"parquet")``, the same shuffle and split, and a batched ``map`` that renders the
  same chat template (prompt, then prompt + answer) and tokenises with the same tokenizer (the demo's), masking the
  prompt, in as many processes as tuner chooses for the size (``data.num_proc`` unset: one per core from 40,000
  rows on).  Chat rows are a system message, a question and an answer.

With ``--repeat N`` each case runs N pairs, interleaved, and prints the medians.
Printed per row: seconds of preparation (imports excluded), tuner / plain, tuner's microseconds per row (flat
when the growth is linear), peak RSS of each process and the tokenising processes both sides used.
Target (issue 17): within 1.2x of the plain pipeline at every size, and growth linear in the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_SEQ_LENGTH = 128
EVAL_FRACTION = 0.05
SEED = 42
TARGET_RATIO = 1.2
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def write_rows(path: Path, rows: int, data_format: str) -> None:
    """``rows`` generated samples of ``data_format`` in a .jsonl or .parquet file."""
    chance = random.Random(0)
    samples = []
    for _ in range(rows):
        words = " ".join(chance.choices(WORDS, k=chance.randint(3, 12)))
        answer = " ".join(reversed(words.split()))
        if data_format == "text":
            samples.append({"text": words})
        elif data_format == "instruction":
            samples.append({"instruction": "reverse the words", "input": words, "output": answer})
        else:
            samples.append({"messages": [{"role": "system", "content": "reverse the words"},
                                         {"role": "user", "content": words}, {"role": "assistant", "content": answer}]})
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(samples), path)
        return
    with open(path, "w") as stream:
        stream.writelines(json.dumps(sample) + "\n" for sample in samples)


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_recipe(path: str, data_format: str):
    from tuner.recipe.io import validate_recipe

    return validate_recipe({"model": {"id": "builtin:demo", "dtype": "float32"},
                            "memory": {"mixed_precision": "no", "max_seq_length": MAX_SEQ_LENGTH},
                            "training": {"seed": SEED},
                            "data": {"source": path, "format": data_format, "eval_fraction": EVAL_FRACTION}})


def run_tuner(path: str, data_format: str, tokenizer) -> dict:
    from tuner.data.prepared import prepare_data

    recipe = bench_recipe(path, data_format)
    start = time.perf_counter()
    prepared = prepare_data(recipe, tokenizer)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    prepare_data(recipe, tokenizer)
    return {"seconds": seconds, "reuse_seconds": time.perf_counter() - start, "train_rows": len(prepared.train)}


def run_plain(path: str, data_format: str, tokenizer) -> dict:
    from datasets import load_dataset

    from tuner.data.prepare import tokenising_processes

    recipe = bench_recipe(path, data_format)

    def encode(batch: dict) -> dict:
        if data_format == "text":
            ids = tokenizer([text + tokenizer.eos_token for text in batch["text"]], add_special_tokens=False)["input_ids"]
            return {"input_ids": [i[:MAX_SEQ_LENGTH] for i in ids], "labels": [i[:MAX_SEQ_LENGTH] for i in ids]}
        if data_format == "chat":  # the conversation up to its answer, and the whole of it
            asks, conversations = [m[:-1] for m in batch["messages"]], batch["messages"]
        else:
            users = [f"{instruction}\n{given}" if given else instruction
                     for instruction, given in zip(batch["instruction"], batch["input"])]
            asks = [[{"role": "user", "content": user}] for user in users]
            conversations = [ask + [{"role": "assistant", "content": out}] for ask, out in zip(asks, batch["output"])]
        prompts = [tokenizer.apply_chat_template(ask, tokenize=False, add_generation_prompt=True) for ask in asks]
        fulls = [tokenizer.apply_chat_template(conversation, tokenize=False) for conversation in conversations]
        prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer([full[len(prompt):] for prompt, full in zip(prompts, fulls)],
                               add_special_tokens=False)["input_ids"]
        return {"input_ids": [(p + a)[:MAX_SEQ_LENGTH] for p, a in zip(prompt_ids, answer_ids)],
                "labels": [([-100] * len(p) + a)[:MAX_SEQ_LENGTH] for p, a in zip(prompt_ids, answer_ids)]}

    start = time.perf_counter()
    dataset = load_dataset(Path(path).suffix.lstrip(".").replace("jsonl", "json"), data_files=path,
                           split="train").shuffle(seed=SEED)
    held_out = max(1, round(len(dataset) * EVAL_FRACTION))
    train, evaluation = dataset.select(range(held_out, len(dataset))), dataset.select(range(held_out))
    processes = [tokenising_processes(recipe, len(split)) for split in (train, evaluation)]  # as many as tuner's
    train = train.map(encode, batched=True, remove_columns=train.column_names, num_proc=processes[0])
    evaluation.map(encode, batched=True, remove_columns=evaluation.column_names, num_proc=processes[1])
    return {"seconds": time.perf_counter() - start, "train_rows": len(train), "num_proc": processes[0] or 1}


def child(side: str, path: str, data_format: str, tokenizer_dir: str) -> None:
    import datasets
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    before = peak_mib()
    result = (run_tuner if side == "tuner" else run_plain)(path, data_format, tokenizer)
    print(json.dumps({**result, "peak_mib": peak_mib(), "imports_mib": before}))


def measure(side: str, path: Path, data_format: str, tokenizer_dir: Path) -> dict:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_CACHE": f"{home}/datasets",
               "TUNER_HOME": f"{home}/tuner",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "true"}
        result = subprocess.run([sys.executable, __file__, "--child", side, str(path), data_format,
                                 str(tokenizer_dir)],
                                capture_output=True, text=True, env=env, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"{side} failed on {path}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--formats", nargs="+", default=["text", "instruction", "chat"],
                        choices=("text", "instruction", "chat"))
    parser.add_argument("--files", nargs="+", default=["jsonl", "parquet"], choices=("jsonl", "parquet"))
    parser.add_argument("--repeat", type=int, default=1, help="pairs per case (plain, tuner, plain, ...): the "
                        "median of each side is printed, and the ratio is the median of the pairs' ratios")
    parser.add_argument("--big", type=int, default=0, help="one more size, run only for the --big-cases")
    parser.add_argument("--big-cases", nargs="*", default=[], metavar="FORMAT.FILE", help="e.g. text.jsonl")
    parser.add_argument("--child", nargs=4, metavar=("SIDE", "FILE", "FORMAT", "TOKENIZER"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(*options.child)
        return 0
    sys.path.insert(0, str(REPO))
    from tuner.loading.demo_model import builtin_model_path

    tokenizer_dir = builtin_model_path("builtin:demo")  # built once, before anything is timed
    cases = [(rows, data_format, kind) for rows in options.sizes for data_format in options.formats
             for kind in options.files]
    cases += [(options.big, *case.split(".")) for case in options.big_cases if options.big]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"{'format':<12}{'file':<8}{'rows':>9}  {'tuner s':>8}  {'plain s':>8}  {'ratio':>6}  {'us/row':>6}  {'reuse s':>8}  "
          f"{'tuner MiB':>9}  {'plain MiB':>9}  {'procs':>5}")
    ok = True
    with tempfile.TemporaryDirectory() as folder:
        for rows, data_format, kind in cases:
            path = Path(folder) / f"{data_format}-{rows}.{kind}"
            write_rows(path, rows, data_format)
            pairs = [(measure("plain", path, data_format, tokenizer_dir), measure("tuner", path, data_format,
                                                                                  tokenizer_dir))
                     for _ in range(options.repeat)]
            ratio = statistics.median(tuner["seconds"] / plain["seconds"] for plain, tuner in pairs)
            plain, tuner = ({key: statistics.median(side[key] for side in sides) for key in sides[0]}
                            for sides in zip(*pairs))
            ok = ok and ratio <= TARGET_RATIO
            print(f"{data_format:<12}{kind:<8}{rows:>9}  {tuner['seconds']:>8.2f}  {plain['seconds']:>8.2f}  "
                  f"{ratio:>6.2f}  {tuner['seconds'] / rows * 1e6:>6.0f}  {tuner['reuse_seconds']:>8.2f}  {tuner['peak_mib']:>9.0f}  {plain['peak_mib']:>9.0f}"
                  f"  {plain['num_proc']:>5.0f}",
                  flush=True)
            path.unlink()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end; target ratio <= {TARGET_RATIO}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
