"""``tuner infer/chat --tp N`` as a user runs it: two real gloo ranks on this CPU, each holding half of every split
layer, answer token for token as the single-process model does; only rank 0 prints; a stop reaches every rank; what
tensor parallelism cannot run is refused before any rank starts."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import REPO, process_running
from test_cli_arguments import run_cli
from test_infer import make_lora_run

from tuner.infer.target import resolve_target
from tuner.infer.tensor_parallel import check_tensor_parallel
from tuner.loading.model import ModelLoadError

GREEDY = ["--greedy", "--max-new-tokens", "12"]
WORDS = ["hello", "abcdef", "stone", "xy", "planet"]
RANK_ROW = re.compile(r"^│ ([01]) \(cpu\) +│ +([\d.]+) MiB │ +([\d.]+) MiB │", re.MULTILINE)


def answered_alike(tmp_path, tuner_cli, run, *split_flags):
    """The run's greedy answers to :data:`WORDS` (a batch file) in one process and split by ``split_flags``: both
    commands (their output) and the single process's answers, which the split ones equal, each word its own."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": word}) + "\n" for word in WORDS))
    outputs = {name: tmp_path / f"{name}.jsonl" for name in ("one", "split")}
    single = tuner_cli("infer", str(run), "--input", str(prompts), "--output", str(outputs["one"]), *GREEDY)
    assert single.returncode == 0, single.stderr
    split = tuner_cli("infer", str(run), "--input", str(prompts), "--output", str(outputs["split"]), *split_flags,
                      *GREEDY, timeout=300)
    assert split.returncode == 0, split.stderr
    expected, answers = ([json.loads(line)["answer"] for line in path.read_text().splitlines()]
                         for path in outputs.values())
    assert len(set(expected)) == len(WORDS)  # the reference is not one repeated token
    assert answers == expected
    return single, split, expected


@pytest.mark.slow
@pytest.mark.xdist_group("trained-demo")  # the trained run is built once per worker, by the tests that share it
def test_two_ranks_answer_token_for_token_as_one_process(tmp_path, tuner_cli, trained_demo):
    """A trained run (its answers differ per word) through infer and chat on 2 ranks; the demo's tokenizer has one
    token per character, so equal answers are equal tokens."""
    single, split, expected = answered_alike(tmp_path, tuner_cli, trained_demo, "--tp", "2")
    # rank 0 alone prints: one table, one speed line, nothing on stdout
    assert split.stderr.count("Tensor-parallel placement (2 ranks)") == 1, split.stderr
    assert len(re.findall(r"^\d+ tokens in .* tokens/s$", split.stderr, re.MULTILINE)) == 1
    assert split.stdout == "" and "Model placement" not in split.stderr
    # each rank holds half of every split weight and a whole copy of the norms
    rows = RANK_ROW.findall(split.stderr)
    assert [rank for rank, _, _ in rows] == ["0", "1"], split.stderr
    (_, split_mib, replicated_mib), (_, other_split, _) = rows
    whole_mib = float(re.search(r"^│ CPU +│ +\d+ │ +([\d.]+) MiB", single.stderr, re.MULTILINE).group(1))
    assert split_mib == other_split
    assert 2 * float(split_mib) + float(replicated_mib) == pytest.approx(whole_mib, abs=0.15)
    said = " ".join(split.stderr.split())  # the caption wraps at the width of the stream
    assert "weights split: lm_head (colwise_gather_output), embed_tokens (embedding_rowwise), q_proj (colwise)" in said
    assert "o_proj (rowwise)" in said and "replicated: input_layernorm, post_attention_layernorm, norm" in said

    # chat: rank 0 reads the piped messages, every rank runs each answer (an instruction run: one message at a time)
    chat = tuner_cli("chat", str(trained_demo), "--tp", "2", *GREEDY, input="\n".join(WORDS[:3]) + "\n", timeout=300)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.splitlines() == expected[:3]
    assert "Ctrl-C ends the chat on every rank" in chat.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
@pytest.mark.parametrize("signum, split", [(signal.SIGINT, "--tp"), (signal.SIGTERM, "--tp"), (signal.SIGINT, "--pp")])
def test_a_stop_reaches_every_rank(signum, split, demo_model_path):
    """Ctrl-C (SIGINT to tuner, the terminal's foreground process) or SIGTERM while rank 0 waits for a message
    and rank 1 for rank 0: tuner stops both and exits 128 + the signal (tensor-parallel ranks or pipeline stages)."""
    import psutil

    tuner = subprocess.Popen([sys.executable, "-m", "tuner", "chat", "--model", str(demo_model_path), split, "2"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        said = []
        for line in tuner.stderr:  # rank 0 says how to chat once every rank has loaded
            said.append(line)
            if "Ctrl-C ends the chat" in line:
                break
        ranks = psutil.Process(tuner.pid).children()
        assert len(ranks) == 2, "".join(said)
        tuner.send_signal(signum)
        assert tuner.wait(timeout=60) == 128 + signum
        assert "stopping every rank" in tuner.stderr.read()
        assert not [rank.pid for rank in ranks if process_running(rank.pid)]
    finally:
        tuner.kill()
        tuner.communicate()


@pytest.mark.parametrize("arguments, expected", [
    (["--tp", "3"], "--tp 3 must divide builtin:demo's attention heads 4, KV heads 2, MLP width 344: use --tp 2, "),
    (["--tp", "2", "--bits", "4"], "--tp 2 cannot load --bits 4: transformers' tensor-parallel plan splits 16/32-bit"),
    (["--tp", "2", "--set", "method.kind=qlora", "--set", "method.quantization.bits=4"],
     "--tp 2 cannot load method.quantization (qlora)"),
    (["--tp", "2", "--max-memory", "cpu=1GiB"], "--tp 2 with --max-memory: those place whole layers"),
    (["--tp", "2", "--offload-folder", "offload"], "--tp 2 with --offload-folder: those place whole layers"),
])
def test_what_tensor_parallelism_cannot_run_is_refused_before_any_rank_starts(arguments, expected):
    code, err = run_cli("infer", "demo", "--prompt", "hi", *arguments)
    assert code == 2 and err.startswith(f"error: {expected}"), err
    code, err = run_cli("chat", "demo", *arguments)
    assert code == 2 and err.startswith(f"error: {expected}"), err


def test_ranks_must_fit_the_machine_and_adapters_be_merged_first(tmp_path, demo_model_path):
    target = resolve_target(model=str(demo_model_path))
    with pytest.raises(ModelLoadError, match=r"--tp 2 needs 2 GPUs on this machine, 1 are visible: use --tp 1"):
        check_tensor_parallel(target, 2, gpus=1)
    with pytest.raises(ModelLoadError, match=r"--tp 2 without a GPU runs 2 processes on 1 CPU core\(s\)"):
        check_tensor_parallel(target, 2, gpus=0, cpus=1)
    check_tensor_parallel(target, 2, gpus=0, cpus=2)  # the demo splits over two CPU processes
    lora = make_lora_run(tmp_path / "lora-run", demo_model_path)
    with pytest.raises(ModelLoadError, match=r"merge it into its base model first \(tuner merge RUN\)"):
        check_tensor_parallel(replace(target, adapter=lora / "final"), 2, gpus=0, cpus=2)
