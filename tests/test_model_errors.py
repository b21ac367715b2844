"""A model that cannot load is one paragraph naming model.id and what to do, from the tokenizer as from the weights."""
from __future__ import annotations

import logging

import pytest

from tuner.doctor import check_model
from tuner.loading.model import ModelLoadError, choose_attention, load_model, load_tokenizer
from tuner.recipe.io import validate_recipe

# transformers is imported inside the tests, after conftest has set HF_HUB_OFFLINE=1: huggingface_hub
# reads it once at import, and an online lookup of a missing model waits for network timeouts.


def recipe_for(model_id: str):
    return validate_recipe({"model": {"id": model_id}, "memory": {"mixed_precision": "no"}})


def assert_one_paragraph(message: str, *needles: str) -> None:
    assert message.startswith("model.id: ") and "\n" not in message, message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("load", [load_tokenizer, load_model])
def test_unknown_hub_model_offline_says_how_to_get_it(load, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as error:
        load(recipe_for("acme/not-in-any-cache"))
    assert_one_paragraph(str(error.value), "'acme/not-in-any-cache'", "HF_HUB_OFFLINE", "hf download acme/not-in-any-cache")


@pytest.mark.parametrize("load", [load_tokenizer, load_model])
def test_local_directory_without_config_json(load, tmp_path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError) as error:
        load(recipe_for(str(tmp_path)))
    assert_one_paragraph(str(error.value), str(tmp_path), "no config.json")


@pytest.mark.parametrize("model_id", ["/no/such/model/dir", "./missing", "not a hub id!"])
def test_missing_path_is_not_sent_to_the_hub(model_id) -> None:
    with pytest.raises(ModelLoadError) as error:
        load_tokenizer(recipe_for(model_id))
    assert_one_paragraph(str(error.value), model_id, "no such directory")


def test_doctor_checks_the_model_before_launch(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert check_model(recipe_for("builtin:demo")).status == "ok"
    offline = check_model(recipe_for("acme/not-in-any-cache"))
    assert offline.status == "fail" and "HF_HUB_OFFLINE" in offline.detail and "hf download" in offline.fix
    assert check_model(recipe_for(str(tmp_path))).status == "fail"


def test_flash_attention_falls_back_with_a_reason() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU flash may really be available")
    attention, reason = choose_attention("flash")
    assert attention == "sdpa" and "falling back to sdpa" in reason


def test_loading_logs_the_attention_it_chose(demo_model_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="tuner")
    load_model(recipe_for("builtin:demo"))
    assert any(record.getMessage().startswith("attention: ") for record in caplog.records)


@pytest.mark.parametrize("command", [["validate", "-q"], ["render", "-o", "{tmp}/run"], ["plan"], ["doctor"],
                                     ["infer", "--prompt", "hi"],
                                     ["render", "-o", "{tmp}/run", "--set", "hardware.gpus_per_machine=2", "--set",
                                      "hardware.gpu=A100-80GB", "--set", "memory.distributed=fsdp"]])
@pytest.mark.parametrize("model", ["acme/not-in-any-cache", "folder-without-config"])
def test_a_model_tuner_cannot_find_is_one_paragraph_from_every_command(command, model, tmp_path, capsys,
                                                                       monkeypatch) -> None:
    from tuner.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder-without-config").mkdir()
    code = main([command[0], "demo", *[arg.format(tmp=tmp_path) for arg in command[1:]], "--set", f"model.id={model}"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code in (0, 1, 2), err  # validate and a plain render need no model; doctor's check fails (exit 1)
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1 and "model.id" in err, err
