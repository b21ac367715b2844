"""Random edit sequences through the wizard's draft, as its fields make them (choices, toggles, typed text).

Two properties: a field the user did not touch never changes, and a saved recipe renders byte for byte
what the Review screen showed (``tuner render`` of the saved file).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tuner.cli import main as tuner_main
from tuner.recipe.io import load_recipe
from tuner.recipe.overrides import leaves
from tuner.render.run_directory import render_run_files
from tuner.rundir.layout import MANIFEST
from tuner.tui.draft import Draft
from tuner.tui.screens.method_choices import DISTRIBUTION, METHODS, OPTIMIZERS
from tuner.tui.widgets.fields import value_choices

pytestmark = pytest.mark.slow  # saves and renders generated drafts

CHOICES = [choice.changes for choice in METHODS + DISTRIBUTION + OPTIMIZERS] + [
    choice.changes for field, values in {
        "memory.offload_optimizer": ["none", "cpu", "nvme"], "memory.offload_params": ["none", "cpu", "nvme"],
        "memory.attention": ["auto", "sdpa", "eager"], "memory.mixed_precision": ["bf16", "fp16", "no"],
        "memory.fsdp.sharding_strategy": ["full_shard", "shard_grad_op"], "data.format": ["auto", "instruction"],
        "training.lr_scheduler": ["linear", "cosine"], "hardware.gpu": ["A100-80GB", "RTX4090", None],
    }.items() for choice in value_choices(field, values)]
TOGGLES = ["memory.gradient_checkpointing", "memory.activation_offloading", "memory.chunked_loss",
           "method.allow_method_change", "data.packing", "data.train_on_prompt"]
NUMBER_BOXES = ["hardware.machines", "hardware.gpus_per_machine", "hardware.host_ram_gb", "hardware.num_processes",
                "training.micro_batch_size", "training.gradient_accumulation_steps", "training.max_seq_length",
                "method.lora.r", "training.learning_rate", "training.max_steps", "data.eval_fraction"]
TEXT_BOXES = ["name", "output.dir", "training.resume", "hardware.nvme_path"]
DERIVED = {"output.dir", "model.dtype", "hardware.num_processes", "output.save"}  # follow other fields by design

number_text = st.one_of(st.integers(-2, 4096).map(str), st.sampled_from(["", "0.5", "1e-4", "512", "lots", "8.0"]))
text_text = st.one_of(st.sampled_from(["", "demo-2", "runs/elsewhere", "auto", "never", "bad name!"]),
                      st.text(alphabet="abc-_ 9", max_size=8))
edits = st.one_of(
    st.sampled_from(CHOICES).map(lambda changes: (dict(changes), None)),
    st.tuples(st.sampled_from(TOGGLES), st.booleans()).map(lambda pair: ({pair[0]: pair[1]}, None)),
    st.tuples(st.sampled_from(NUMBER_BOXES), number_text).map(lambda pair: ({pair[0]: _number(pair[1])}, pair[1])),
    st.tuples(st.sampled_from(TEXT_BOXES), text_text).map(lambda pair: ({pair[0]: pair[1].strip() or None}, pair[1])),
)


def _number(text: str):
    """What a number box sends for its text (tuner.tui.widgets.fields parses the same way)."""
    from tuner.tui.widgets.fields import _parse_number

    return _parse_number(text)


START = {"name": "start", "model": {"id": "builtin:demo"}, "data": {"max_samples": 50}, "memory": {"attention": "sdpa"}}


@contextlib.contextmanager
def working_in(directory: Path):
    before = Path.cwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def dotted_leaves(data: dict) -> dict[str, object]:
    return {".".join(keys): value for keys, value in leaves(data).items()}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(edits, min_size=1, max_size=10))
def test_untouched_fields_never_change_and_saved_recipes_render_as_reviewed(demo_model_path, sequence):
    draft = Draft(START)
    initial_data, initial = dotted_leaves(draft.data), dotted_leaves(draft.resolved.model_dump(mode="json"))
    touched: set[str] = set()
    for changes, typed in sequence:
        draft.apply(changes, typed=typed)
        touched |= set(changes)

        def untouched(field: str) -> bool:
            return not any(field == key or field.startswith(f"{key}.") for key in touched)

        now_data = dotted_leaves(draft.data)
        assert {f: v for f, v in now_data.items() if untouched(f)} == {
            f: v for f, v in initial_data.items() if untouched(f)}
        resolved = dotted_leaves(draft.resolved.model_dump(mode="json"))
        for field, value in initial.items():
            if untouched(field) and field not in DERIVED:
                assert resolved.get(field) == value, field
        for field, text in ((key, typed) for key in changes if typed is not None):
            assert draft.shown(field) == text  # a box shows what was typed in it

    event("valid" if draft.valid else "invalid")
    if draft.recipe is None:
        return
    with tempfile.TemporaryDirectory() as tmp, working_in(Path(tmp)):
        saved = Path(tmp) / "saved" / "recipe.yaml"  # beside, not inside, the run directory it renders
        saved.parent.mkdir()
        draft.save(saved)
        assert load_recipe(saved) == draft.recipe
        reviewed = render_run_files(draft.recipe)
        assert tuner_main(["render", str(saved)]) == 0
        written = {path.name: path.read_text() for path in Path(draft.recipe.output.dir).iterdir() if path.is_file()}
        assert written.pop(MANIFEST)  # the record of what tuner wrote, beside what Review showed
        assert written == reviewed
