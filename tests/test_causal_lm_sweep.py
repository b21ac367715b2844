"""Every causal-LM class of the installed transformers plans as a new user would plan it (its defaults, four layers,
saved with save_pretrained: benchmarks/causal_lm_sweep.py): held to the count of the model transformers builds from
the same folder, or to a named refusal; and the table in docs/memory.md is the sweep's."""
from __future__ import annotations

import json
import re

import pytest

from benchmarks.causal_lm_sweep import DOCS_MARKER, causal_lm_types, sweep_one
from conftest import REPO

# transformers 5.24 cannot build these classes from their own default config, cut or uncut (AutoConfig plus
# AutoModelForCausalLM.from_config on the meta device fail): there is nothing for tuner to plan.
NOT_BUILT = {
    "cohere_compass_text": "'full_attention'",  # its default layer_types name a kind its layers do not map
    "dbrx": "has no attribute 'rope_theta'",  # the attention sub-config lacks what the model reads
    "dots1": "empty() takes 1 positional argument",  # an expert count the defaults leave unset
    "gemma3n": "requires the timm library",  # its vision tower needs timm, not installed
    "gemma4_assistant": "hidden_size_per_layer_input must be 0",  # its defaults fail its own validator
    "hunyuan_v1_dense": "unsupported operand type(s) for ** or pow()",  # rope settings the defaults leave unset
    "hunyuan_v1_moe": "unsupported operand type(s) for ** or pow()",
    "lfm2_moe": "'NoneType' object is not subscriptable",
    "ministral": "unsupported operand type(s) for ** or pow()",
    "musicgen": "has no attribute 'dropout'",  # a composite config whose causal LM is its decoder alone
    "musicgen_melody": "has no attribute 'dropout'",
    "nemotron": "unsupported operand type(s) for //",  # head_dim left None
    "qwen4_exp": "unsupported operand type(s) for //",
    "qwen4_exp_text": "unsupported operand type(s) for //",
    "reformer": "make sure that `is_decoder=True`",  # its defaults are an encoder
}
VERDICTS = ("fits", "tight", "does not fit", "cannot judge")
MAMBA2_HYBRIDS = ("granitemoehybrid", "nemotron_h", "falcon_h1", "bamba")  # issue 55: refused before
DOC_TABLE = re.compile(re.escape(DOCS_MARKER) + r"\n(.*?)\n\n", re.S)


def _documented() -> dict[str, tuple[str, str]]:
    """model_type -> (result, total column) of docs/memory.md's sweep table."""
    block = DOC_TABLE.search((REPO / "docs" / "memory.md").read_text())
    assert block, "docs/memory.md must hold the sweep's table (python -m benchmarks.causal_lm_sweep writes it)"
    rows = {}
    for line in block[1].splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


DOCUMENTED = _documented()


def test_the_docs_table_lists_every_causal_lm_class_of_the_installed_transformers():
    assert sorted(DOCUMENTED) == causal_lm_types()
    assert set(NOT_BUILT) <= set(DOCUMENTED)


@pytest.mark.slow  # 196 classes: 50 s on one loaded core (23 s of CPU), half that on make test's two workers
@pytest.mark.parametrize("model_type", causal_lm_types())
def test_every_causal_lm_class_plans_its_meta_built_total_or_is_a_named_refusal(model_type, tmp_path):
    swept = sweep_one(model_type, tmp_path)
    if model_type in NOT_BUILT:
        assert swept.result == "not built" and NOT_BUILT[model_type] in swept.note, swept
    else:
        assert swept.result in VERDICTS, swept  # tuner refuses no config transformers builds
        assert swept.total == swept.meta_total, swept
        assert swept.result != "cannot judge" or "cannot judge: " in swept.note, swept
    row = swept.row().strip("|").split(" | ")
    assert DOCUMENTED.get(model_type) == (row[1].strip(), row[2].strip()), (
        f"docs/memory.md's sweep table is stale for {model_type}: python -m benchmarks.causal_lm_sweep writes it")


@pytest.mark.parametrize("model_type", MAMBA2_HYBRIDS)
def test_the_mamba2_hybrids_plan_their_meta_total_and_say_the_mixer_is_not_modelled(model_type, tmp_path, capsys):
    """The issue's reproduction: transformers saves their time_step_limit's inf as {"__float__": "Infinity"}; tuner
    plans them (LoRA, as the issue asks) with no verdict on the Mamba-2 mixer rather than refusing the config."""
    from benchmarks.causal_lm_sweep import cut_config, meta_total
    from tuner.cli import main

    cut_config(model_type).save_pretrained(tmp_path)
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    assert main(["plan", "--model", str(tmp_path), "--gpus", "1x80GB", "--method", "lora", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "cannot judge"
    assert data["params"]["total"] == meta_total(tmp_path)
    assert any("a Mamba-2 mixer: not modelled" in part for part in data["unmodelled"])
