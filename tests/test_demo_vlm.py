"""The image-text demo (``builtin:demo-vlm``, a tiny LLaVA; ``builtin:shapes``, Pillow-drawn pictures) for real on
this CPU: `tuner demo --recipe demo-vlm` fine-tunes it and the held-out exact match rises; the trained run then answers a picture through `tuner infer --image` and `tuner chat`'s
``/image``, and `tuner export --format gguf` refuses it, naming the projector file it would need.  One training run
(the session fixture), shared by every test here."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import run_tuner

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trained-demo-vlm")]


@pytest.fixture(scope="module")
def demo_vlm(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("demo-vlm")
    done = run_tuner("demo", "--recipe", "demo-vlm", "-o", "runs/vlm", cwd=cwd, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return cwd, cwd / "runs" / "vlm", done.stdout


def held_out_score(stdout: str, when: str) -> float:
    return float(re.search(rf"{when} training: held-out exact match ([\d.]+)%", stdout).group(1))


def test_demo_vlm_learns_to_name_the_shape_and_its_colour(demo_vlm):
    _, run_dir, stdout = demo_vlm
    before, after = held_out_score(stdout, "before"), held_out_score(stdout, "after")
    assert before < 20 and after - before >= 50, stdout
    assert (run_dir / "final" / "processor_config.json").is_file()  # the processor is saved with the model
    assert json.loads((run_dir / "final" / "config.json").read_text())["architectures"] == \
        ["LlavaForConditionalGeneration"]


def test_the_trained_run_answers_a_picture_through_infer_and_chat(demo_vlm, tuner_cli):
    """The picture reaches the model: its colour, which only the image tells, is named, and chat answers it as infer
    does.  (Which shape: the held-out score above measures; one picture's shape is right in most runs, not all.)"""
    from tuner.data.shapes import COLOURS, SHAPES, draw_shape
    import random

    cwd, run_dir, _ = demo_vlm
    draw_shape("circle", "blue", random.Random(7)).save(cwd / "blue.png")
    answered = tuner_cli("infer", str(run_dir), "--image", "blue.png", "--prompt", "what is drawn?", cwd=cwd)
    assert answered.returncode == 0, answered.stderr[-2000:]
    answer = answered.stdout.strip()
    assert answer in {f"blue {shape}" for shape in SHAPES}, (answer, sorted(COLOURS))
    chat = tuner_cli("chat", str(run_dir), cwd=cwd, input="/image blue.png\nwhat is drawn?\n/image nothing.png\n")
    assert chat.returncode == 0, chat.stderr[-2000:]
    assert answer in chat.stdout, chat.stdout
    assert "(image 32x32 attached to the next message)" in chat.stderr
    assert "/image: nothing.png: no such image file; nothing attached" in chat.stderr, chat.stderr
    missing = tuner_cli("infer", str(run_dir), "--image", "nothing.png", "--prompt", "what is drawn?", cwd=cwd)
    assert missing.returncode == 2 and "--image: nothing.png: no such image file" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr


def test_gguf_export_of_an_image_text_model_is_refused_with_the_reason(demo_vlm, tuner_cli):
    cwd, run_dir, _ = demo_vlm
    refused = tuner_cli("export", str(run_dir), "--format", "gguf", cwd=cwd)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "image-text model" in refused.stderr and "projector file (mmproj GGUF)" in refused.stderr
    assert not (run_dir / "export").exists()


def test_serve_answers_an_openai_data_url_image_as_infer_does_and_fetches_no_remote_url(demo_vlm, tuner_cli):
    import base64
    import os
    import random
    import signal
    import subprocess
    import sys

    from openai import BadRequestError, OpenAI

    from conftest import REPO
    from test_serve import free_port, wait_until_serving
    from tuner.data.shapes import draw_shape

    cwd, run_dir, _ = demo_vlm
    draw_shape("triangle", "green", random.Random(3)).save(cwd / "green.png")
    expected = tuner_cli("infer", str(run_dir), "--image", "green.png", "--prompt", "what is drawn?", cwd=cwd)
    assert expected.returncode == 0, expected.stderr[-2000:]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tuner", "serve", str(run_dir), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_until_serving(port, server, server.stderr.read)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-needed", max_retries=0, timeout=120)
        (model,) = [entry.id for entry in client.models.list().data]
        data_url = "data:image/png;base64," + base64.b64encode((cwd / "green.png").read_bytes()).decode()

        def ask(url: str) -> str:
            content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is drawn?"}]
            return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                                  max_tokens=16, temperature=0).choices[0].message.content

        assert ask(data_url).strip() == expected.stdout.strip()
        with pytest.raises(BadRequestError, match="only data: URLs are accepted"):
            ask("http://127.0.0.1:9/green.png")  # refused before anything could fetch it
        with pytest.raises(BadRequestError, match="not an image file"):
            ask("data:image/png;base64," + base64.b64encode(b"plain words").decode())
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=60)


def test_lora_on_two_ranks_under_zero3_resumes_merges_and_the_merged_model_answers_as_the_adapter(demo_vlm, tuner_cli):
    """LoRA on the trained image-text model over two gloo ranks under DeepSpeed ZeRO-3 (whose save gathers the
    partitioned adapters): it checkpoints and resumes from the newest checkpoint; `tuner merge` saves a model (with
    its processor: images need it) that answers every picture as the adapter does through `tuner infer --image`, and
    two pictures differently.  ZeRO-2, and Gemma 3's processor, are tests/test_image_text_ranks.py's."""
    from image_text_lora_ranks import answers_by_picture, train_then_resume

    cwd, trained, _ = demo_vlm
    run_dir, _ = train_then_resume(tuner_cli, cwd, "lora-zero3", str(trained / "final"), 3, "data.max_samples=16",
                                   "training.learning_rate=0.0001", "training.micro_batch_size=4")
    assert (run_dir / "final" / "adapter_model.safetensors").is_file()
    merged = tuner_cli("merge", str(run_dir), cwd=cwd)
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert (run_dir / "merged" / "processor_config.json").is_file()
    answers = {colour: set(said) for colour, said in
               answers_by_picture(tuner_cli, cwd, run_dir, run_dir / "merged").items()}
    assert all(len(said) == 1 for said in answers.values()), answers  # the merged model answers as the adapter
    assert answers["blue"] != answers["red"], answers  # and the picture is what it answers about
