"""LoRA on two gloo ranks for the image-text models users bring (issue 50, "Train"): a tiny Gemma 3 and a tiny
Qwen2.5-VL, each with its own processor (tests/tiny_image_text_models.py), trained on the built-in shapes under
DeepSpeed ZeRO-2 and ZeRO-3, resumed from the newest checkpoint, merged, and the merged model asked through
`tuner infer --image` as the adapter is.

Qwen2.5-VL's processor is built by transformers 5.24 only with its video processor, which needs torchvision; where
torchvision is missing its cases are skipped, naming why, and a run of it is refused with that reason (below)."""
from __future__ import annotations

import json

import pytest

from image_text_lora_ranks import answers_by_picture, train_then_resume
from tiny_image_text_models import save_tiny_image_text_model

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("image-text-ranks")]
KINDS = ("gemma3", "qwen2_5_vl")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("image-text-ranks")
    return root, {kind: save_tiny_image_text_model(root / kind, kind) for kind in KINDS}


def _why_processor_cannot_load(folder) -> str | None:
    """Why transformers cannot load the folder's processor here; None when it can."""
    from transformers import AutoProcessor

    try:
        AutoProcessor.from_pretrained(folder)
    except ImportError as exc:
        return " ".join(str(exc).split())
    return None


def _tensors(file) -> dict:
    from safetensors.torch import load_file

    return load_file(file)


def test_a_model_whose_processor_needs_a_missing_library_is_refused_before_launch(tiny_models, tuner_cli):
    """Said once, before anything is written or launched, as a library to install -- not as a damaged file, and
    not by every rank (as it was)."""
    root, folders = tiny_models
    missing = _why_processor_cannot_load(folders["qwen2_5_vl"])
    if missing is None:
        pytest.skip("Qwen2_5_VLProcessor loads here (torchvision is installed)")
    refused = tuner_cli("run", "demo-vlm", "--set", f"model.id={folders['qwen2_5_vl']}", "--set", "method.kind=lora",
                        "--set", "output.dir=runs/refused", cwd=root)
    assert refused.returncode == 2, refused.stderr[-2000:]
    message = refused.stderr.strip()
    assert "a library its classes need is not installed" in message and "Torchvision" in message, message
    assert "damaged" not in message and "launching" not in refused.stdout + message and "rank 0" not in message
    assert not (root / "runs" / "refused").exists()


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_lora_on_two_ranks_under_zero_resumes_merges_and_the_merged_model_answers_as_the_adapter(
        tiny_models, tuner_cli, kind, stage):
    """Two steps checkpointing each, then a third resumed from checkpoint-2 that trains on (constant learning rate:
    a finished cosine schedule would leave the resumed step at zero).  After ZeRO-3, whose save gathers the
    partitioned adapters (ZeRO-2 saves the same files from whole ones, so its half stops there), `tuner merge`
    saves the model with its processor, its language model changed and its frozen tower not, and the merged model
    answers each of two pictures as the adapter does.  (Whether the two pictures get different answers is not
    asserted: three steps leave the random tiny model answering every picture alike.)"""
    cwd, folders = tiny_models
    base = folders[kind]
    if kind == "qwen2_5_vl" and (missing := _why_processor_cannot_load(base)):
        pytest.skip(f"Qwen2_5_VLProcessor cannot be loaded here: {missing}")
    run_dir, _ = train_then_resume(tuner_cli, cwd, f"{kind}-zero{stage}", str(base), stage,
                                   "training.learning_rate=0.003", "data.max_samples=10", "training.micro_batch_size=2")
    before, after = (_tensors(run_dir / where / "adapter_model.safetensors")
                     for where in ("checkpoints/checkpoint-2", "final"))
    assert before.keys() == after.keys() and any(not before[key].equal(after[key]) for key in before)
    if stage == 2:
        return  # the merge reads the saved adapter; ZeRO-3's is the one assembled from shards
    merged = tuner_cli("merge", str(run_dir), cwd=cwd)
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert json.loads((run_dir / "merged" / "config.json").read_text())["model_type"] == kind
    assert _why_processor_cannot_load(run_dir / "merged") is None
    original, merged_weights = _tensors(base / "model.safetensors"), _tensors(run_dir / "merged" / "model.safetensors")
    assert original.keys() == merged_weights.keys()
    changed = {key for key in original if not original[key].equal(merged_weights[key])}
    assert changed and all("language_model" in key for key in changed), sorted(changed)
    answers = answers_by_picture(tuner_cli, cwd, run_dir, run_dir / "merged")
    assert all(len(set(said)) == 1 and said[0] for said in answers.values()), answers
