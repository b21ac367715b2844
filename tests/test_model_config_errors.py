"""A damaged or hostile model config.json is refused by `tuner plan` and `tuner validate` with one message naming the
file and the key, exit 2: no traceback, no runaway build, no negative parameter count."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.catalog.model_config import SIZES
from tuner.cli import main

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128)
MOE = dict(LLAMA, model_type="qwen3_moe", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)

# (case, config.json text, what the message names)
CASES = [
    ("a list", "[]", "the top level is a list, not a mapping"),
    ("a string", '"llama"', "the top level is a string"),
    ("null", "null", "the top level is null"),
    ("text_config a list", json.dumps({"model_type": "gemma3", "text_config": [1, 2]}), "text_config: a list"),
    ("text_config a string", json.dumps({"model_type": "gemma3", "text_config": "x"}), "text_config: a string"),
    ("0 heads", json.dumps(dict(LLAMA, num_attention_heads=0)), "num_attention_heads: 0 is too small"),
    ("0 layers", json.dumps(dict(LLAMA, num_hidden_layers=0)), "num_hidden_layers: 0 is too small"),
    ("hidden 10^9", json.dumps(dict(LLAMA, hidden_size=10**9)), "hidden_size: 1000000000 is larger than any model"),
    ("1e400", json.dumps(LLAMA).replace('"hidden_size": 64', '"hidden_size": 1e400'),
     "hidden_size: an infinite number is not a whole number"),
    ("negative", json.dumps(dict(LLAMA, intermediate_size=-96)), "intermediate_size: -96 is negative"),
    ("a string size", json.dumps(dict(LLAMA, vocab_size="many")), "vocab_size: 'many' is not a whole number"),
    ("experts per token > experts", json.dumps(dict(MOE, num_experts_per_tok=8)),
     "num_experts_per_tok: 8 experts per token, but the model has 4"),
    ("kv heads not dividing", json.dumps(dict(LLAMA, num_key_value_heads=3)), "num_key_value_heads: 3 does not divide"),
    ("30 levels deep", json.dumps(dict(LLAMA, rope_scaling=json.loads("{\"a\": " * 30 + "1" + "}" * 30))),
     "nested more than 24 levels deep"),
    ("100000 levels deep", "{\"a\": " * 100000 + "1" + "}" * 100000, "nested too deeply to read"),
    ("not JSON", "{model_type: llama", "not valid JSON"),
]


@pytest.mark.parametrize("case, text, expected", CASES, ids=[case[0] for case in CASES])
def test_plan_and_validate_refuse_a_damaged_config_naming_the_file_and_key(tmp_path, capsys, case, text, expected):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(text)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model:\n  id: {model}\n")
    for argv in (["plan", "--model", str(model), "--gpus", "1xA100-80GB"], ["validate", str(recipe)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{model / 'config.json'}: " in err and expected in err, err
        assert "Traceback" not in err


def test_an_architecture_transformers_cannot_build_is_named_with_its_reason(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA, model_type="no_such_architecture")))
    assert main(["plan", "--model", str(tmp_path), "--gpus", "1xA100-80GB"]) == 2
    err = capsys.readouterr().err
    assert "model_type 'no_such_architecture' is not a model the installed transformers knows" in err
    assert "Traceback" not in err


def test_the_cli_answers_a_hostile_config_without_a_traceback(tmp_path, tuner_cli):
    (tmp_path / "config.json").write_text("{\"a\": " * 100000 + "1" + "}" * 100000)
    result = tuner_cli("plan", "--model", str(tmp_path), "--gpus", "1xA100-80GB")
    assert result.returncode == 2
    assert "nested too deeply to read" in result.stderr and "Traceback" not in result.stderr


# A config.json as transformers 5 saves one: any settings, with non-finite floats anywhere (to_json_string writes
# them as {"__float__": "Infinity"}), beside mappings that merely look like the tag and stay as they are.
_LEAVES = st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=8)
_LOOKALIKES = st.sampled_from([{"__float__": "Infinity", "x": 1}, {"__float__": "bogus"}, {"__float__": 1}])
_VALUES = st.recursive(_LEAVES | _LOOKALIKES, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda key: key not in SIZES), _VALUES,
                             max_size=6))
def test_a_config_is_read_as_transformers_reads_it(tmp_path, extra):
    """Whatever transformers' own loader makes of a config.json, read_config makes of it (NaN compares by JSON)."""
    from transformers.configuration_utils import PreTrainedConfig

    from tuner.catalog.model_config import read_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(PreTrainedConfig._encode_special_floats(dict(LLAMA, **extra))))
    ours, theirs = read_config(path), PreTrainedConfig._dict_from_json_file(path)
    assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True)


def test_an_infinite_size_saved_by_transformers_is_refused_as_infinite(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA, hidden_size={"__float__": "Infinity"})))
    assert main(["plan", "--model", str(tmp_path), "--gpus", "1xA100-80GB"]) == 2
    assert "hidden_size: an infinite number is not a whole number" in capsys.readouterr().err
