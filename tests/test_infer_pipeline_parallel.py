"""``tuner infer/chat --pp N`` as a user runs it: two real gloo ranks on this CPU, each holding a run of whole layers
(transformers' pipeline stages), answer token for token as the single-process model does; only rank 0 prints; what
pipeline stages cannot run is refused before any rank starts."""
from __future__ import annotations

import re

import pytest
from test_cli_arguments import run_cli
from test_infer_tensor_parallel import GREEDY, WORDS, answered_alike

from tuner.catalog.models import model_facts
from tuner.infer.pipeline_parallel import check_pipeline_parallel
from tuner.infer.placement import GIB, placement_table
from tuner.infer.rank_placement import PipelinePlacement, StageShare, stage_buffers_bytes
from tuner.infer.target import resolve_target
from tuner.loading.model import ModelLoadError

# a stage's row: its rank, its layers, weights, KV cache, buffers
STAGE_ROW = re.compile(r"^│ ([01]) \(cpu\) +│ +(\d+-\d+) \(\d+\) │ +([\d.]+) MiB │ +([\d.]+) MiB │ +([\d.]+) MiB │",
                       re.MULTILINE)
DEVICE_ROW = re.compile(r"^│ CPU +│ +\d+ │ +([\d.]+) MiB │ +([\d.]+) MiB", re.MULTILINE)


@pytest.mark.slow
@pytest.mark.xdist_group("trained-demo")  # the trained run is built once per worker, by the tests that share it
def test_two_stages_answer_token_for_token_as_one_process(tmp_path, tuner_cli, trained_demo):
    """A trained run (its answers differ per word) through infer and chat on 2 stages; the demo's tokenizer has one
    token per character, so equal answers are equal tokens."""
    single, staged, expected = answered_alike(tmp_path, tuner_cli, trained_demo, "--pp", "2")
    one = tuner_cli("infer", str(trained_demo), "--prompt", WORDS[0], "--pp", "2", *GREEDY, timeout=300)
    assert one.returncode == 0 and one.stdout == expected[0] + "\n", one.stderr
    # rank 0 alone prints: one table, one speed line, nothing on stdout
    assert staged.stderr.count("Pipeline placement (2 stages)") == 1, staged.stderr
    assert len(re.findall(r"^\d+ tokens in .* tokens/s$", staged.stderr, re.MULTILINE)) == 1
    assert staged.stdout == "" and "Model placement" not in staged.stderr
    # transformers' layer_range_for_rank: layers 0-1 on stage 0, 2-3 on stage 1, each stage caching its own layers
    rows = STAGE_ROW.findall(staged.stderr)
    assert [(rank, layers) for rank, layers, *_ in rows] == [("0", "0-1"), ("1", "2-3")], staged.stderr
    whole_mib, whole_kv = map(float, DEVICE_ROW.search(single.stderr).groups())
    (_, _, first_mib, first_kv, _), (_, _, last_mib, last_kv, _) = rows
    assert float(first_kv) == float(last_kv) == pytest.approx(whole_kv / 2, abs=0.1)
    # the tied embedding is kept on the last stage too (for its lm_head): 100 tokens x 128 float32
    embedding_mib = 100 * 128 * 4 / 2**20
    assert float(first_mib) + float(last_mib) == pytest.approx(whole_mib + embedding_mib, abs=0.15)

    # chat: rank 0 reads the piped messages, every rank runs each answer (an instruction run: one message at a time)
    chat = tuner_cli("chat", str(trained_demo), "--pp", "2", *GREEDY, input="\n".join(WORDS[:3]) + "\n", timeout=300)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.splitlines() == expected[:3]
    assert "Ctrl-C ends the chat on every rank" in chat.stderr


@pytest.mark.parametrize("arguments, expected", [
    (["--pp", "5"], "--pp 5 splits builtin:demo's 4 decoder layers into 5 stages, so 1 stage(s) would hold no layer "
                    "(transformers' layer_range_for_rank): use --pp 4 or less"),
    (["--pp", "2", "--tp", "2"], "--pp 2 with --tp 2: tuner splits a model one way at a time"),
    (["--pp", "2", "--bits", "4"], "--pp 2 cannot load --bits 4: tuner has not run bitsandbytes' 4/8-bit weights"),
    (["--pp", "2", "--max-memory", "cpu=1GiB"], "--pp 2 with --max-memory: those place whole layers"),
    (["--pp", "2", "--model", "builtin:demo-vlm"],
     "--pp: transformers' pipeline stages (apply_pipeline_parallelism) replace a causal LM's model.embed_tokens, "
     "model.layers, model.norm, lm_head with identity layers where a stage does not own them, and builtin:demo-vlm's "
     "LlavaForConditionalGeneration has no model.embed_tokens, model.layers, model.norm; drop --pp"),
])
def test_what_pipeline_stages_cannot_run_is_refused_before_any_rank_starts(arguments, expected):
    code, err = run_cli("infer", "demo", "--prompt", "hi", *arguments)
    assert code == 2 and err.startswith(f"error: {expected}"), err
    code, err = run_cli("chat", "demo", *arguments)
    assert code == 2 and err.startswith(f"error: {expected}"), err


def test_an_image_has_no_stage():
    code, err = run_cli("infer", "demo", "--prompt", "hi", "--image", "shape.png", "--pp", "2")
    assert code == 2 and err.startswith("error: --pp 2 with --image: transformers' pipeline stages carry a text "
                                        "model's hidden states"), err


def test_stages_may_be_uneven_as_transformers_splits_them_but_must_fit_the_machine(demo_model_path):
    """3 stages over the demo's 4 layers: transformers gives the remainder to the first stages (2, 1, 1)."""
    target = resolve_target(model=str(demo_model_path))
    check_pipeline_parallel(target, 3, gpus=0, cpus=3)
    check_pipeline_parallel(target, 4, gpus=4)
    with pytest.raises(ModelLoadError, match=r"--pp 2 needs 2 GPUs on this machine, 1 are visible: use --pp 1"):
        check_pipeline_parallel(target, 2, gpus=1)
    with pytest.raises(ModelLoadError, match=r"--pp 2 without a GPU runs 2 processes on 1 CPU core\(s\)"):
        check_pipeline_parallel(target, 2, gpus=0, cpus=1)


def test_the_buffers_in_flight_are_what_the_naive_forward_sends_and_broadcasts():
    """Llama-3.1-8B in bf16, a prefill of 8192 tokens: 64 MiB of hidden states per direction (8192 x 4096 x 2 B) and
    the last position's logits (128256 x 2 B) on every stage; the middle stage of three receives and sends."""
    facts = model_facts("meta-llama/Llama-3.1-8B")
    hidden, logits = 8192 * 4096 * 2, 128256 * 2
    assert stage_buffers_bytes(facts, 1, 8192, 2, first=True, last=False) == hidden + logits
    assert stage_buffers_bytes(facts, 1, 8192, 2, first=False, last=False) == 2 * hidden + logits
    assert stage_buffers_bytes(facts, 1, 8192, 2, first=False, last=True) == hidden + logits


def test_the_stage_table_has_a_row_per_stage_and_flags_a_stage_its_gpu_cannot_hold():
    """Llama-3.1-8B in bf16 over 2 GPUs of 24 GB (illustrative numbers)."""
    from rich.console import Console

    rows = (StageShare(0, "cuda:0", 0, 16, int(7.5 * GIB), int(0.5 * GIB), int(0.07 * GIB), int(22 * GIB)),
            StageShare(1, "cuda:1", 16, 32, int(7.5 * GIB), int(0.5 * GIB), int(0.07 * GIB), int(6 * GIB)))
    placement = PipelinePlacement(rows, 1, 4096, 32, int(2 * GIB), "tuner catalog")
    console = Console(record=True, width=100)
    console.print(placement_table(placement))
    text = console.export_text()
    assert "Pipeline placement (2 stages)" in text
    assert "│ 1 (cuda:1) │ 16-31 (16) │  7.50 GiB │ 0.50 GiB │ 71.7 MiB │  8.07 GiB │  6.00 GiB │" in text
    [warning] = placement.warnings()
    assert warning == ("stage 1 (cuda:1): weights + KV cache + buffers (8.07 GiB) exceed the GPU's 8.00 GiB; lower "
                       "--batch-size or --context, or use more stages (--pp).")
