"""Distillation (objective.kind: distill) through TRL's GKDTrainer: the teacher's tokenizer checked at validate, the
recipe mapped to GKDConfig, the trainer's teacher and prompts, and (slow) demo-distill for real on this CPU."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.catalog.demo import DEMO_SMALL_MODEL_ID, DEMO_VOCAB_SIZE
from tuner.recipe.distill_checks import tokenizer_problem
from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.registry import builtin_path, planned_as
from tuner.recipe.source import RecipeError

SAMPLES = [{"instruction": f"reverse\n{word}", "output": word[::-1]} for word in ("abc", "wxyz", "qrs", "mno")]


def make_recipe(tmp_path, teacher="builtin:demo", distill=None, objective=None, **sections):
    data = tmp_path / "samples.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in SAMPLES))
    return validate_recipe({
        "model": {"id": DEMO_SMALL_MODEL_ID, "dtype": "float32"},
        "objective": {"kind": "distill", "teacher": teacher, **(objective or {}), "distill": distill or {}},
        "memory": {"mixed_precision": "no"},
        "training": {"micro_batch_size": 2, "max_seq_length": 32},
        "data": {"source": str(data), "eval_fraction": 0},
        "output": {"dir": str(tmp_path / "run")},
        **sections,
    })


def model_folder(tmp_path: Path, name: str, vocab: dict[str, int], vocab_size: int | None = None) -> Path:
    """A local model folder holding only what validate reads: config.json and tokenizer.json."""
    from tuner.catalog.models import builtin_config

    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    config = {**builtin_config(), "vocab_size": vocab_size or len(vocab), "architectures": ["LlamaForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordLevel", "vocab": vocab},
                                                      "added_tokens": []}))
    return folder


def refusal(path: Path, tuner_cli) -> str:
    result = tuner_cli("validate", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    return result.stderr


def write_recipe(tmp_path, teacher: str, student: str = DEMO_SMALL_MODEL_ID) -> Path:
    path = tmp_path / "distill.yaml"
    path.write_text(f"model:\n  id: {student}\nobjective:\n  kind: distill\n  teacher: {teacher}\n"
                    "data:\n  source: builtin:reverse\n")
    return path


# -- the teacher, refused at validate before anything runs ----------------------------------------------------------

def test_a_teacher_of_another_vocabulary_size_is_refused_in_trls_words_at_its_line(tmp_path, tuner_cli):
    teacher = model_folder(tmp_path, "teacher", {chr(97 + i): i for i in range(26)}, vocab_size=32000)
    message = refusal(write_recipe(tmp_path, str(teacher)), tuner_cli)
    assert re.search(r"distill\.yaml:5: objective\.teacher: ", message), message
    assert (f"The student model has vocab_size {DEMO_VOCAB_SIZE} but the teacher model has vocab_size 32000"
            in message and "requires a shared vocabulary" in message)  # GKDTrainer's own words
    assert message.count("\n") <= 2


def test_a_teacher_numbering_the_same_tokens_otherwise_is_refused(tmp_path, tuner_cli, demo_model_path):
    ids = json.loads((demo_model_path / "tokenizer.json").read_text())["model"]["vocab"]
    swapped = dict(ids)
    swapped["a"], swapped["b"] = ids["b"], ids["a"]
    teacher = model_folder(tmp_path, "teacher", swapped, vocab_size=DEMO_VOCAB_SIZE)
    message = refusal(write_recipe(tmp_path, str(teacher), student="builtin:demo"), tuner_cli)
    assert "objective.teacher: " in message and "numbers 2 tokens other than the student's" in message
    assert f"'a' is id {ids['a']} for the student and {ids['b']} for the teacher" in message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(student=st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 50), min_size=1, max_size=12),
       data=st.data())
def test_any_two_tokenizers_pass_exactly_when_they_number_every_token_alike(tmp_path_factory, student, data):
    """The class: two tokenizers on this machine. Refused iff some token's id differs (or one lacks it)."""
    teacher = data.draw(st.one_of(st.just(dict(student)), st.dictionaries(
        st.text(min_size=1, max_size=3), st.integers(0, 50), min_size=1, max_size=12)))
    root = tmp_path_factory.mktemp("tokenizers")
    problem = tokenizer_problem(str(model_folder(root, "s", student)), str(model_folder(root, "t", teacher)),
                                None, None)
    assert (problem is None) == (student == teacher)
    if problem is not None:
        assert "requires a shared vocabulary" in problem
    assert tokenizer_problem("s", "t", 100, 101).startswith("The student model has vocab_size 100")


def test_distill_needs_a_teacher_and_its_settings_belong_to_distill(tmp_path):
    with pytest.raises(RecipeError, match="objective.teacher: distill learns from a teacher"):
        validate_recipe({"objective": {"kind": "distill"}, "data": {"source": "builtin:reverse"}})
    with pytest.raises(RecipeError, match="objective.teacher is a distill setting") as error:
        validate_recipe({"objective": {"kind": "sft", "teacher": "builtin:demo", "distill": {}}})
    assert "objective.distill is a distill setting" in str(error.value)
    for section, field in (({"data": {"packing": True}}, "data.packing"),
                           ({"memory": {"chunked_loss": True}}, "memory.chunked_loss")):
        with pytest.raises(RecipeError, match=re.escape(field)):
            make_recipe(tmp_path, **section)
    with pytest.raises(RecipeError, match="max_new_tokens"):
        make_recipe(tmp_path, distill={"max_new_tokens": 32})
    with pytest.raises(RecipeError, match="distill reads instruction or chat data"):
        make_recipe(tmp_path, data={"source": "builtin:reverse", "format": "text"})


def test_demo_distill_is_planned_on_the_demo_before_its_teacher_is_trained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(builtin_path("demo-distill"))
    assert recipe.objective.teacher == "runs/demo/final" and recipe.model.id == DEMO_SMALL_MODEL_ID
    assert planned_as(recipe).objective.teacher == "builtin:demo"  # demo's own model, until demo has run


# -- the trainer ------------------------------------------------------------------------------------------------------

def test_every_distill_setting_reaches_gkd_config_and_the_teacher_is_frozen(tmp_path, demo_model_path):
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from tuner.loading.model import load_tokenizer
    from tuner.train.__main__ import training_arguments
    from tuner.train.distill import distill_trainer

    recipe = make_recipe(tmp_path, distill={"on_policy": 1.0, "beta": 0.1, "temperature": 0.7, "max_new_tokens": 8,
                                            "sequence_level": True}, training={"micro_batch_size": 2,
                                                                               "max_seq_length": 32, "max_steps": 1})
    args = training_arguments(recipe, tmp_path)
    assert isinstance(args, GKDConfig)
    assert (args.lmbda, args.beta, args.temperature, args.max_new_tokens, args.seq_kd) == (1.0, 0.1, 0.7, 8, True)
    assert args.max_length == 32 and args.learning_rate == recipe.training.learning_rate and not args.bf16
    trainer, data = distill_trainer(recipe, args, load_tokenizer(recipe), [])
    assert isinstance(trainer, GKDTrainer) and data.data_format == "instruction" and len(data.train) == 4
    assert not any(p.requires_grad for p in trainer.teacher_model.parameters())
    assert sum(p.numel() for p in trainer.teacher_model.parameters()) > 1.5 * sum(
        p.numel() for p in trainer.model.parameters())  # the demo (4 layers) teaches its sibling of 2
    batch = trainer.data_collator([data.train[0], data.train[1]])
    for row, sample in zip(range(2), (data.train[0], data.train[1])):
        start = next(i for i, label in enumerate(sample["labels"]) if label != -100)
        prompt = batch["prompts"][row][batch["prompt_attention_mask"][row].bool()].tolist()
        assert prompt == sample["input_ids"][:start]  # the prompt as SFT renders it, left-padded
        assert batch["prompt_attention_mask"][row][-1] == 1
    result = trainer.train()  # on-policy: the student samples from those prompts, the teacher scores its samples
    assert result.global_step == 1 and math.isfinite(result.training_loss)


# -- demo-distill, for real --------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.xdist_group("trained-demo")
def test_demo_distill_raises_the_students_exact_match_beside_the_teachers(trained_demo, tmp_path, tuner_cli):
    """The trained demo (the session's fixture) teaches builtin:demo-small off-policy for one epoch: its held-out
    exact match rises from nothing (0.0% -> 3.0% measured) and its held-out divergence falls, the teacher's exact
    match shown beside it."""
    result = tuner_cli("demo", "--recipe", "demo-distill", "--set", f"objective.teacher={trained_demo / 'final'}",
                       "--set", "training.epochs=1", "-o", str(tmp_path / "run"), cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    teacher = re.search(r"teacher \(.*\): held-out exact match ([\d.]+)%", result.stdout)
    before = re.search(r"before training: held-out exact match ([\d.]+)%", result.stdout)
    after = re.search(r"after training: held-out exact match ([\d.]+)%", result.stdout)
    assert teacher and before and after, result.stdout
    assert float(after.group(1)) > float(before.group(1)), result.stdout
    from tuner.rundir.events import read_events

    evals = [e.get("eval_loss") for e in read_events(tmp_path / "run" / "events.jsonl") if e.get("eval_loss")]
    assert evals[-1] < 0.8 * evals[0], evals
    assert "(the teacher's " in result.stdout.splitlines()[-1]
    shutil.rmtree(tmp_path / "run" / "final", ignore_errors=True)  # the suite's disk: the student is not reused


# -- the plan: the teacher placed, GKD's logits, held to a trace ---------------------------------------------------

def test_the_teacher_is_planned_beside_the_student_sharded_with_it_or_in_4_bit(tmp_path):
    from benchmarks.distill_traces import TEACHERS, distill_recipe
    from tuner.catalog.models import model_facts
    from tuner.planner import plan

    recipe = distill_recipe(tmp_path, "llama", "full", False, 64, 1, 0.0)
    teacher = model_facts(recipe.objective.teacher).param_counts.total
    single = plan(recipe).devices[0].terms["teacher_model"]
    assert single * 2**30 == pytest.approx(teacher * 4)  # fp32, whole on the one device
    data = recipe.model_dump(mode="json")
    gpus = {"gpus_per_machine": 4, "gpu": "H100-80GB"}
    for memory, share in (({"distributed": "deepspeed", "zero_stage": 3, "mixed_precision": "bf16"}, 2 / 4),
                          ({"distributed": "deepspeed", "zero_stage": 2, "mixed_precision": "bf16"}, 2 / 1),
                          ({"distributed": "fsdp"}, 4 / 4), ({"distributed": "ddp"}, 4 / 1)):
        sharded = validate_recipe({**data, "hardware": {**data["hardware"], **gpus, "num_processes": None},
                                   "memory": {**data["memory"], **memory}})
        assert plan(sharded).devices[0].terms["teacher_model"] * 2**30 == pytest.approx(teacher * share), memory
    assert TEACHERS["llama"]["vocab_size"] == 4096


CHECKED_CELLS = [("llama", "full", False, 192, 3, 0.5), ("llama", "lora", True, 192, 3, 0.0),
                 ("qwen2", "full", True, 64, 1, 0.0), ("qwen2", "lora", False, 192, 3, 0.5)]


@pytest.mark.slow
@pytest.mark.parametrize("shape, method, checkpointing, seq, batch, beta", CHECKED_CELLS)
def test_the_distill_plan_is_within_8_percent_of_a_traced_gkd_step(tmp_path, shape, method, checkpointing, seq,
                                                                   batch, beta):
    from benchmarks.distill_traces import distill_recipe, planned_and_traced

    planned, traced = planned_and_traced(distill_recipe(tmp_path, shape, method, checkpointing, seq, batch, beta))
    assert planned == pytest.approx(traced, rel=0.08)


def test_the_wizard_offers_distill_with_teachers_of_the_models_tokenizer():
    from tuner.catalog.teachers import teacher_candidates
    from tuner.tui.draft import Draft
    from tuner.tui.screens.method_choices import OBJECTIVES, TEACHERS

    assert teacher_candidates(DEMO_SMALL_MODEL_ID) == ("builtin:demo", "builtin:demo-moe")  # nearest in size first
    assert {"Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B"} <= set(teacher_candidates("Qwen/Qwen3-0.6B"))
    assert not any(t.startswith("meta-llama/") for t in teacher_candidates("Qwen/Qwen3-0.6B"))  # another tokenizer
    draft = Draft()
    draft.apply({"model.id": DEMO_SMALL_MODEL_ID})
    distill = next(choice for choice in OBJECTIVES if choice.changes["objective.kind"] == "distill")
    draft.apply(distill.changes_for(draft))
    assert draft.valid, draft.errors
    assert draft.value("objective.teacher") == "builtin:demo"
    assert [t.label for t in TEACHERS if t.offered_in(draft)] == ["builtin:demo", "builtin:demo-moe"]
    sft = next(choice for choice in OBJECTIVES if choice.changes["objective.kind"] == "sft")
    draft.apply(sft.changes_for(draft))
    assert draft.valid and draft.value("objective.teacher") is None  # the teacher goes with distill
