"""A model that ships its own code (config.json's ``auto_map``) is found before anything loads it, from a local
folder or the Hugging Face cache: refused naming ``model.trust_remote_code`` when the recipe does not allow it,
a warning naming the model when it does.  Never transformers' own wording, and its code never runs uninvited."""
from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.cli import main

AUTO_MAP = {"AutoConfig": "configuration_acme.AcmeConfig", "AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"}
PAYLOAD = "import pathlib\npathlib.Path('pwned').write_text('remote code ran')\n"


def with_custom_code(model_dir, demo_model_path):
    shutil.copytree(demo_model_path, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "auto_map": AUTO_MAP}))
    # code that runs (the payload) and then works as Llama's, so a trusted plan can build the model on the meta device
    (model_dir / "configuration_acme.py").write_text(
        PAYLOAD + "from transformers import LlamaConfig\n\n\nclass AcmeConfig(LlamaConfig):\n    pass\n")
    (model_dir / "modeling_acme.py").write_text(
        PAYLOAD + "from transformers import LlamaForCausalLM\n\nfrom .configuration_acme import AcmeConfig\n\n\n"
        "class AcmeForCausalLM(LlamaForCausalLM):\n    config_class = AcmeConfig\n")  # as a hub model's code names it
    return model_dir


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(autouse=True)
def in_a_folder_of_its_own(tmp_path, monkeypatch):
    """The payload writes ``pwned`` where it runs; a trusted test runs it, so never in the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def custom_model(tmp_path, demo_model_path):
    return with_custom_code(tmp_path / "acme-model", demo_model_path)


@pytest.fixture
def cached_custom_model(tmp_path, demo_model_path, monkeypatch):
    """acme/custom-7b in a Hugging Face cache of its own, as `hf download` leaves it."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    repo = cache / "models--acme--custom-7b"
    with_custom_code(repo / "snapshots" / ("a" * 40), demo_model_path)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return "acme/custom-7b"


def run_cli(capsys, *args) -> tuple[int, str]:
    code = main([str(arg) for arg in args])
    return code, capsys.readouterr().err


COMMANDS = {
    "validate": ["validate", "-q", "demo"],
    "plan": ["plan", "demo"],
    "render": ["render", "demo", "-o", "{tmp}/run"],
    "doctor": ["doctor", "demo"],
    "infer": ["infer", "demo", "--prompt", "hi"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where", ["local folder", "hub cache"])
def test_custom_code_is_refused_naming_the_setting(command, where, custom_model, cached_custom_model, tmp_path,
                                                   capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    model_id = str(custom_model) if where == "local folder" else cached_custom_model
    args = [arg.format(tmp=tmp_path) for arg in COMMANDS[command]]
    code, err = run_cli(capsys, *args, "--set", f"model.id={model_id}")
    assert code == 2, err
    assert err.startswith("error: --set model.id: model.trust_remote_code: "), err
    assert f"{model_id} ships its own Python code (configuration_acme.AcmeConfig, modeling_acme.AcmeForCausalLM)" in err
    assert "trust_remote_code=True" not in err and "huggingface.co" not in err and "Traceback" not in err
    assert not (tmp_path / "run").exists() and not list(tmp_path.rglob("pwned"))


def test_infer_with_a_custom_code_folder_as_model_is_refused_before_loading(custom_model, tmp_path, capsys,
                                                                         monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, "infer", "--model", custom_model, "--prompt", "hi")
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith(f"error: --model: model.trust_remote_code: {custom_model} ships its own Python code"), err
    code, err = run_cli(capsys, "infer", "demo", "--model", custom_model, "--prompt", "hi")
    assert code == 2 and "model.trust_remote_code" in err and "trust_remote_code=True" not in err, err
    assert not list(tmp_path.rglob("pwned"))


def test_trusting_it_is_a_warning_naming_the_model(custom_model, capsys) -> None:
    code, err = run_cli(capsys, "validate", "-q", "demo", "--set", f"model.id={custom_model}",
                        "--set", "model.trust_remote_code=true")
    assert code == 0, err
    assert err.startswith("warning: model.trust_remote_code: ") and str(custom_model) in err
    assert "modeling_acme.AcmeForCausalLM" in err


def test_a_model_without_custom_code_says_nothing(demo_model_path, capsys) -> None:
    code, err = run_cli(capsys, "validate", "-q", "demo", "--set", f"model.id={demo_model_path}")
    assert code == 0 and err == ""


@pytest.mark.parametrize("nested", ["text_config", "vision_config"])
def test_code_shipped_by_a_nested_config_is_found(nested, tmp_path, demo_model_path, capsys) -> None:
    model_dir = tmp_path / "composite"
    shutil.copytree(demo_model_path, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, nested: {"model_type": "acme", "auto_map": AUTO_MAP}}))
    code, err = run_cli(capsys, "validate", "-q", "demo", "--set", f"model.id={model_dir}")
    assert code == 2 and "model.trust_remote_code: " in err and "modeling_acme.AcmeForCausalLM" in err, err


def test_print_vllm_refuses_a_model_that_ships_code_unless_the_recipe_trusts_it(custom_model, capsys) -> None:
    vllm = ["serve", "demo", "--model", custom_model, "--print", "vllm", "--gpus", "1xA100-80GB"]
    code, err = run_cli(capsys, *vllm)
    assert code == 2 and "model.trust_remote_code: " in err and "ships its own Python code" in err, err
    assert "vllm serve" not in capsys.readouterr().out
    code = main([str(arg) for arg in [*vllm, "--set", "model.trust_remote_code=true"]])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("vllm serve ") and "--trust-remote-code" in out, out



def plan_trusted(model_id: str, capsys) -> tuple[int, str, str]:
    code = main(["plan", "demo", "--set", f"model.id={model_id}", "--set", "model.trust_remote_code=true", "--json"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    """A tuner home with no inventory of the acme config, and no facts this process found before: built now."""
    from tuner.catalog.models import model_facts

    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    model_facts.cache_clear()
    yield
    model_facts.cache_clear()


def test_a_trusted_hub_model_with_its_own_code_is_planned_from_the_cache(cached_custom_model, demo_model_path,
                                                                       fresh_home, capsys) -> None:
    code, out, err = plan_trusted(cached_custom_model, capsys)
    assert code == 0, err
    assert json.loads(out)["params"]["total"] == main_plan_total(demo_model_path, capsys)  # a Llama of the demo's size


def main_plan_total(model_id, capsys) -> int:
    assert main(["plan", "demo", "--set", f"model.id={model_id}", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["params"]["total"]


def test_a_trusted_hub_model_whose_code_is_not_cached_is_refused_offline_naming_the_files(
        cached_custom_model, fresh_home, tmp_path, capsys) -> None:
    snapshot = tmp_path / "hub" / "models--acme--custom-7b" / "snapshots" / ("a" * 40)
    (snapshot / "configuration_acme.py").unlink()
    code, out, err = plan_trusted(cached_custom_model, capsys)
    assert code == 2 and "Traceback" not in err, err
    assert f"{cached_custom_model}: model.trust_remote_code: its own code is not in the Hugging Face cache" in err
    assert "config.json, configuration_acme.py, modeling_acme.py" in err and "Unset HF_HUB_OFFLINE" in err, err
    assert f"hf download {cached_custom_model} config.json configuration_acme.py modeling_acme.py" in err, err
    assert "Repo id" not in err and not list(tmp_path.rglob("pwned"))


@pytest.mark.slow
def test_a_trusted_hub_model_fetches_only_its_config_and_code_from_the_hub(demo_model_path, tmp_path, capsys,
                                                                         monkeypatch) -> None:
    from conftest import run_tuner

    from hub_server import HubRepo, LocalHub

    repo = HubRepo.from_folder(with_custom_code(tmp_path / "acme", demo_model_path))
    broken = HubRepo({name: content for name, content in repo.files.items() if name != "configuration_acme.py"})
    with LocalHub({"acme/online-7b": repo, "acme/broken-7b": broken}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "TUNER_HOME": str(tmp_path / "home"),
               "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
        monkeypatch.delenv("HF_TOKEN", raising=False)  # a developer's own token is nothing to send anywhere
        result = run_tuner("plan", "demo", "--set", "model.id=acme/online-7b", "--set", "model.trust_remote_code=true",
                           "--json", env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert sorted(hub.downloads()) == ["config.json", "configuration_acme.py", "modeling_acme.py"]  # no weights
        incomplete = run_tuner("plan", "demo", "--set", "model.id=acme/broken-7b", "--set",
                               "model.trust_remote_code=true", env=env, cwd=tmp_path)
        assert incomplete.returncode == 2 and "Traceback" not in incomplete.stderr, incomplete.stderr
        assert "acme/broken-7b: model.trust_remote_code: its code needs configuration_acme.py" in incomplete.stderr
    assert json.loads(result.stdout)["params"]["total"] == main_plan_total(demo_model_path, capsys)


# -- auto_map in a tokenizer_config.json of any size -----------------------------------------------------------------

def big_tokenizer_config(auto_map: dict, tokens: int = 120_000) -> str:
    """A tokenizer_config.json past the 4 MiB config read limit (a large added_tokens_decoder), auto_map last."""
    decoder = {str(i): {"content": f"<extra_{i}>", "special": False} for i in range(tokens)}
    return json.dumps({"added_tokens_decoder": decoder, "auto_map": auto_map})


@pytest.mark.parametrize("command", ["validate", "plan", "infer"])
def test_code_named_in_a_tokenizer_config_over_4_mib_is_found(command, tmp_path, demo_model_path, capsys) -> None:
    model = tmp_path / "big-tokenizer"
    shutil.copytree(demo_model_path, model)
    (model / "tokenizer_config.json").write_text(big_tokenizer_config({"AutoTokenizer": ["tok_acme.AcmeTok", None]}))
    assert (model / "tokenizer_config.json").stat().st_size > 4 * 2**20
    args = [arg.format(tmp=tmp_path) for arg in COMMANDS[command]]
    code, err = run_cli(capsys, *args, "--set", f"model.id={model}")
    assert code == 2 and f"{model} ships its own Python code (tok_acme.AcmeTok)" in err, err
    assert "damaged" not in err and "Traceback" not in err


def _escaped(key: str, which: list[bool]) -> str:
    return "".join(f"\\u{ord(ch):04x}" if escape else ch for ch, escape in zip(key, which))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), chunk=st.sampled_from([64, 97, 256, 4096]))
def test_the_streamed_scan_finds_what_a_full_parse_finds(tmp_path_factory, data, chunk, monkeypatch_module) -> None:
    """For generated configs (auto_map at depth 0-3, its key's letters \\u-escaped at random, any white space around the
    colon, "auto_map" text inside strings, padding that moves it across chunk boundaries) the bounded scan names the
    classes json.loads + code_refs names."""
    from tuner.catalog import models
    from tuner.catalog.model_config import code_refs

    monkeypatch_module.setattr(models, "SCAN_CHUNK", chunk)
    refs = st.text(alphabet="abcdefgh_.", min_size=3, max_size=12)
    where = data.draw(st.lists(st.sampled_from(["text_config", "vision_config", "sub"]), max_size=3))
    present = data.draw(st.booleans())
    config: dict = {"pad": "x" * data.draw(st.integers(0, 600)),
                    "decoy": data.draw(st.sampled_from(['"auto_map": {"A": "x.Y"}', "auto_map", '\\"auto_map\\":{'])),
                    data.draw(st.sampled_from(["auto_mapx", "autoMap", "model_type"])): {"A": "not.Code"}}
    node = config
    for name in where:
        node = node.setdefault(name, {"pad": "y" * data.draw(st.integers(0, 200))})
    if present:
        node["auto_map"] = {"AutoTokenizer": [data.draw(refs), None], "AutoModel": data.draw(refs)}
    text = json.dumps(config)
    key = '"auto_map": '
    if present:
        spaces = data.draw(st.text(alphabet=" \t\r\n", max_size=300))
        escaped = _escaped("auto_map", data.draw(st.lists(st.booleans(), min_size=8, max_size=8)))
        text = text.replace(key, f'"{escaped}"{spaces}:{spaces[::-1]}')
    path = tmp_path_factory.mktemp("cfg") / "tokenizer_config.json"
    path.write_text(text)
    parsed = json.loads(text)
    expected = code_refs(parsed) if present else set()
    assert models.streamed_code_refs(path) == expected
