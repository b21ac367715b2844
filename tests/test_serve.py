"""tuner serve: transformers' OpenAI-compatible server on 127.0.0.1 answers the official openai client (plain and
streamed) with a trained run, in the run's prompt format; base + adapter loads as tuner loads it;
--print vllm writes a vllm serve command sized from the plan, with flags vLLM documents."""
from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO
from tuner.cli import main
from tuner.data.formats import ALPACA_PROMPT_WITH_INPUT, DEFAULT_CHAT_TEMPLATE
from tuner.infer.target import resolve_target
from tuner.loading.model import ModelLoadError
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_path
from tuner.render.run_directory import write_run_directory

VLLM_FLAGS = REPO / "tests" / "data" / "vllm_serve_flags.txt"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(port: int, server: subprocess.Popen, output) -> None:
    """Until /health answers 200 (at most 300 s); ``output()`` says why when the server ended first."""
    deadline = time.monotonic() + 300
    while True:
        assert server.poll() is None, output()[-3000:]
        assert time.monotonic() < deadline, "the server did not come up in 300 s"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)


def lora_run(tmp_path: Path, demo_model_path: Path, modules_to_save: list[str]) -> Path:
    """A lora run directory whose adapter changes the model (random B, a perturbed final norm) without training:
    what `tuner run demo-lora` leaves in final/, written by peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = load_recipe(builtin_path("demo-lora"), [f"method.lora.modules_to_save={json.dumps(modules_to_save)}",
                                                     "method.lora.r=12"])
    run_dir = write_run_directory(recipe, tmp_path / "lora-run")
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(demo_model_path), LoraConfig(
        r=12, lora_alpha=32, target_modules="all-linear", modules_to_save=modules_to_save, init_lora_weights=False))
    for name, parameter in model.named_parameters():
        if "modules_to_save" in name:
            parameter.data.mul_(1.5)
    model.save_pretrained(run_dir / "final")
    AutoTokenizer.from_pretrained(demo_model_path).save_pretrained(run_dir / "final")
    (run_dir / "final" / "recipe.lock.yaml").write_text((run_dir / "recipe.lock.yaml").read_text())
    return run_dir


def test_base_plus_adapter_loads_in_transformers_as_tuner_loads_it(tmp_path, demo_model_path):
    """The serving folder holds the base model and the adapter: transformers' server loads it the way it loads every
    model (the architecture class's from_pretrained) and gets the logits tuner's own loading gets."""
    import torch
    import transformers

    from tuner.infer.load import load_for_inference
    from tuner.infer.serve import serving_folder

    run_dir = lora_run(tmp_path, demo_model_path, ["norm"])
    target = resolve_target(str(run_dir))
    served = serving_folder(target)
    assert served.path == run_dir / "serve" and not served.wrote_chat_template, "the demo tokenizer has a template"
    config = transformers.AutoConfig.from_pretrained(served.path)
    model = getattr(transformers, config.architectures[0]).from_pretrained(served.path)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        served_logits = model(ids).logits
        tuner_logits = load_for_inference(target, context=16, max_memory={"cpu": "1GiB"}).model(input_ids=ids).logits
        base_logits = transformers.AutoModelForCausalLM.from_pretrained(demo_model_path)(ids).logits
    assert torch.allclose(served_logits, tuner_logits, atol=1e-5)
    assert (served_logits - base_logits).abs().max() > 0.1, "the adapter (and its saved norm) changed the answer"
    assert not any(path.is_file() and not path.is_symlink() for path in served.path.iterdir()), "links, no copies"
    (served.path / "notes.txt").write_text("mine")
    with pytest.raises(ModelLoadError, match=r"holds files tuner did not write \(notes.txt\)"):
        serving_folder(target)
    assert (served.path / "notes.txt").read_text() == "mine"


def test_a_model_without_chat_template_is_served_in_the_prompt_format_tuner_trains(tmp_path, demo_model_path):
    from transformers import AutoTokenizer

    from tuner.infer.generate import render_prompt
    from tuner.infer.serve import CHAT_TEMPLATE_FILE, serving_folder

    plain = tmp_path / "plain-model"
    plain.mkdir()
    for path in demo_model_path.iterdir():
        if path.name != CHAT_TEMPLATE_FILE:
            (plain / path.name).symlink_to(path)
    tokenizer = AutoTokenizer.from_pretrained(plain)
    assert tokenizer.chat_template is None
    for data_format, one, two in [
        # as training renders the sample {"instruction": "reverse", "input": "abc"}: first line, then the input
        ("instruction", ALPACA_PROMPT_WITH_INPUT.format(instruction="reverse", input="abc"), None),
        ("chat", None, None),
        ("text", "reverse\nabc", None),
    ]:
        served = serving_folder(resolve_target(model=str(plain), overrides=[f"data.format={data_format}"]))
        assert served.wrote_chat_template and (served.path / CHAT_TEMPLATE_FILE).is_file()
        reloaded = AutoTokenizer.from_pretrained(served.path)
        for messages in ([{"role": "user", "content": "reverse\nabc"}],
                         [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]):
            text = reloaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert text == render_prompt(tokenizer, messages, data_format), "what tuner chat sends"
        single = reloaded.apply_chat_template([{"role": "user", "content": "reverse\nabc"}], tokenize=False,
                                              add_generation_prompt=True)
        assert single == (one or tokenizer.apply_chat_template(
            [{"role": "user", "content": "reverse\nabc"}], tokenize=False, add_generation_prompt=True,
            chat_template=DEFAULT_CHAT_TEMPLATE))


def test_a_busy_port_is_refused_before_loading(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "demo", "--port", str(port)]) == 1
    assert f"127.0.0.1:{port}: the address is in use" in capsys.readouterr().err


# -- vLLM ------------------------------------------------------------------------------------------------------

def documented_vllm_flags() -> dict[str, set[str] | None]:
    """flag -> allowed values (None: any) from tests/data/vllm_serve_flags.txt."""
    flags: dict[str, set[str] | None] = {}
    for line in VLLM_FLAGS.read_text().splitlines():
        if line.startswith("--"):
            flag, _, choices = line.partition(" ")
            flags[flag] = set(choices.split(",")) if choices.strip() else None
    return flags


def check_against_vllm_docs(command: str) -> dict[str, str | None]:
    argv = shlex.split(command)
    assert argv[:2] == ["vllm", "serve"] and not argv[2].startswith("-"), "vllm serve MODEL first"
    documented, given, index = documented_vllm_flags(), {}, 3
    while index < len(argv):
        flag = argv[index]
        assert flag in documented, f"{flag} is not a documented vllm serve argument"
        value = argv[index + 1] if index + 1 < len(argv) and not argv[index + 1].startswith("--") else None
        if documented[flag] is not None:
            assert value in documented[flag], f"{flag} {value}: vLLM accepts {sorted(documented[flag])}"
        given[flag] = value
        index += 2 if value is not None else 1
    return given


def vllm(capsys, *args: str) -> tuple[dict[str, str | None], str]:
    assert main(["serve", *args, "--print", "vllm"]) == 0
    captured = capsys.readouterr()
    return check_against_vllm_docs(captured.out.strip()), captured.err


def test_vllm_tensor_parallel_size_is_the_fewest_gpus_that_hold_weights_and_kv_cache(capsys):
    # Llama-3.1-70B in bf16: 141 GB of weights. One H100 (79.1 GiB, 95% usable) cannot hold them; two hold 65.7 GiB
    # each and leave 8.2 GiB for a KV cache of 160 KiB per token (80 layers x 4 of 8 KV heads x 128 x 2 x 2 bytes).
    flags, err = vllm(capsys, "--model", "meta-llama/Llama-3.1-70B", "--set", "model.dtype=bfloat16",
                      "--gpus", "8xH100-80GB")
    assert flags["--tensor-parallel-size"] == "2" and flags["--gpu-memory-utilization"] == "0.95"
    assert flags["--max-model-len"] == str(2048 + 128), "training.max_seq_length + inference.max_new_tokens"
    assert flags["--host"] == "127.0.0.1" and flags["--dtype"] == "bfloat16"
    assert "weights 65.71 GiB" in err and "KV cache 160.0 KiB per token" in err and "3 more replica(s)" in err
    # Llama-3.1-8B on one 24 GB card: 14.96 GiB of weights, 2 GiB headroom -> utilization 0.91, TP 1
    flags, _ = vllm(capsys, "--model", "meta-llama/Llama-3.1-8B", "--set", "model.dtype=bfloat16",
                    "--gpus", "1xRTX4090", "--context", "8192", "--port", "9000")
    assert (flags["--tensor-parallel-size"], flags["--gpu-memory-utilization"], flags["--max-model-len"],
            flags["--port"]) == ("1", "0.91", "8192", "9000")


def test_vllm_refuses_what_cannot_fit_and_recipes_without_gpus(capsys):
    assert main(["serve", "--model", "meta-llama/Llama-3.1-70B", "--set", "model.dtype=bfloat16",
                 "--gpus", "1xRTX4090", "--print", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "does not fit vLLM on 1 x RTX4090 even at tensor_parallel_size 1" in err and "--gpus" in err
    assert main(["serve", "demo", "--print", "vllm"]) == 2
    assert "vLLM serves on GPUs" in capsys.readouterr().err


def test_vllm_serves_a_run_adapter_as_a_lora_module(tmp_path, demo_model_path, capsys):
    run_dir = lora_run(tmp_path, demo_model_path, [])
    flags, err = vllm(capsys, str(run_dir), "--gpus", "1xA100-80GB")
    assert flags["--enable-lora"] is None and flags["--lora-modules"] == f"demo-lora={run_dir / 'final'}"
    assert flags["--max-lora-rank"] == "16", "r = 12 rounds up to a rank vLLM accepts"
    assert flags["--tokenizer"] == str(run_dir / "final") and "clients ask for model 'demo-lora'" in err
    assert "--served-model-name" not in flags


def test_vllm_refuses_an_adapter_with_whole_modules_and_serves_the_merged_model(tmp_path, demo_model_path, capsys):
    from tuner.loading.merge import merge_adapter

    run_dir = lora_run(tmp_path, demo_model_path, ["norm"])
    assert main(["serve", str(run_dir), "--gpus", "1xA100-80GB", "--print", "vllm"]) == 2
    assert "modules_to_save" in capsys.readouterr().err
    merge_adapter(load_recipe(run_dir / "recipe.lock.yaml"), run_dir / "final", run_dir / "merged")
    capsys.readouterr()
    flags, _ = vllm(capsys, str(run_dir), "--gpus", "1xA100-80GB")
    assert "--enable-lora" not in flags and flags["--served-model-name"] == "demo-lora"


def test_vllm_gets_the_runs_prompt_format_when_the_tokenizer_has_none(tmp_path, demo_model_path, capsys):
    from tuner.data.formats import INSTRUCTION_CHAT_TEMPLATE

    run_dir = lora_run(tmp_path, demo_model_path, [])
    config = json.loads((run_dir / "final" / "tokenizer_config.json").read_text())
    (run_dir / "final" / "chat_template.jinja").unlink()
    config.pop("chat_template", None)
    (run_dir / "final" / "tokenizer_config.json").write_text(json.dumps(config))
    flags, _ = vllm(capsys, str(run_dir), "--gpus", "1xA100-80GB")
    assert flags["--chat-template"] == str(run_dir / "serve" / "chat_template.jinja")
    assert Path(flags["--chat-template"]).read_text() == INSTRUCTION_CHAT_TEMPLATE, "demo-lora trains instructions"


# -- the trained demo behind the server, asked by the openai client ----------------------------------------------

@pytest.mark.slow
@pytest.mark.xdist_group("trained-demo")
def test_the_trained_demo_answers_the_openai_client_on_localhost(trained_demo):
    from openai import OpenAI

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tuner", "serve", str(trained_demo), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_until_serving(port, server, server.stderr.read)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-needed", max_retries=0, timeout=120)
        (model,) = [entry.id for entry in client.models.list().data]
        assert model == str(trained_demo / "serve")
        words = ["abc", "dog", "cat", "sun", "map", "pen"]
        answers = [client.chat.completions.create(model=model, messages=[{"role": "user", "content": f"reverse\n{w}"}],
                                                  max_tokens=5, temperature=0).choices[0].message.content
                   for w in words]
        assert sum(answer == word[::-1] for answer, word in zip(answers, words)) >= 4, answers
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "reverse\ndog"}],
                                                max_tokens=5, temperature=0, stream=True)
        pieces = [chunk.choices[0].delta.content for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
        assert "".join(pieces) == answers[1], "streamed, the same answer"
        # 5.24's streamer hands each token as it is made; 5.25's model process may put several tokens of a busy
        # machine in one chunk, so the pieces are counted only where the model shares the server's process
        from importlib.metadata import version as installed

        from packaging.version import Version

        assert len(pieces) >= 2 or Version(installed("transformers")) >= Version("5.25"), "streamed token by token"
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=60)
    assert server.returncode == 0, err[-2000:]
    assert f"serving at http://127.0.0.1:{port}/v1" in out
    assert "Model placement" in err and "CPU" in err, "the placement is printed before serving"


def test_a_cpu_server_loads_the_weights_in_float32_unless_the_recipe_names_a_dtype(demo_model_path):
    """The training's bf16 default does not reach a CPU server, as it does not reach `tuner infer`."""
    import torch

    from tuner.infer.serve import Server, require_server, serving_folder

    require_server()  # the test extra installs tuner[serve]
    for overrides, dtype, noted in (((), torch.float32, True), (["model.dtype=bfloat16"], torch.bfloat16, False)):
        target = resolve_target(model=str(demo_model_path), overrides=overrides)
        assert target.recipe.model.dtype == "bfloat16"
        server = Server(serving_folder(target), "127.0.0.1", free_port())  # loaded, not listening
        try:
            assert server.dtype() == str(dtype)
            assert bool(server.dtype_note) == noted
        finally:
            server.close()


def test_serve_refuses_a_transformers_release_whose_server_it_does_not_drive():
    """The releases come from the serve extra tuner was installed with, so the message and pyproject agree."""
    from tuner.catalog.model_classes import installed_transformers_version
    from tuner.infer.serve import unsupported_server_transformers

    for served in (installed_transformers_version(), "5.24.0", "5.25.0"):
        assert unsupported_server_transformers(served) is None, served
    problem = unsupported_server_transformers("5.26.0")
    assert "transformers 5.26.0 is installed" in problem and "<5.26" in problem
    assert "pip install 'tuner[serve]'" in problem
