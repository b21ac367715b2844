"""Preference training in tuner's entrypoint: TRL's DPO/KTO trainers built from a recipe with the right reference,
resume refused across objectives, and (slow) the demo-dpo run after SFT, whose held-out rewards rise."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.registry import builtin_path
from tuner.recipe.source import RecipeError
from tuner.rundir.checkpoints import CheckpointRefused, check_resumable, resume_settings
from tuner.rundir.events import read_records
from tuner.rundir.layout import CHECKPOINT_INFO

CHAT_PAIRS = [{"prompt": [{"role": "user", "content": f"reverse\n{word}"}],
               "chosen": [{"role": "assistant", "content": word[::-1]}],
               "rejected": [{"role": "assistant", "content": word[::-1][1:]}]} for word in ("abc", "wxyz", "qrs", "mno")]
UNPAIRED = [{"prompt": f"reverse\n{word}=", "completion": answer, "label": good}
            for word, answer, good in (("abc", "cba", True), ("wxyz", "zyx", False), ("qrs", "srq", True),
                                       ("mno", "on", False))]


def make_recipe(tmp_path, rows, objective="dpo", method="full", settings=None, max_seq_length=64):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return validate_recipe({
        "model": {"id": "builtin:demo", "dtype": "float32"},
        "objective": {"kind": objective, **(settings or {})},
        "method": {"kind": method, "lora": {"dropout": 0.0}},
        "memory": {"mixed_precision": "no", "micro_batch_size": 2, "max_seq_length": max_seq_length},
        "data": {"source": str(data), "eval_fraction": 0},
        "output": {"dir": str(tmp_path / "run")},
    })


def build(recipe, tmp_path):
    from tuner.loading.model import load_tokenizer
    from tuner.train.__main__ import training_arguments
    from tuner.train.preference import preference_trainer

    return preference_trainer(recipe, training_arguments(recipe, tmp_path), load_tokenizer(recipe), [])


def test_full_dpo_trains_against_a_frozen_copy_of_the_starting_model(tmp_path, demo_model_path):
    from trl import DPOConfig, DPOTrainer

    recipe = make_recipe(tmp_path, CHAT_PAIRS, settings={"beta": 0.2, "sft_weight": 0.5})
    trainer, data = build(recipe, tmp_path)
    assert isinstance(trainer, DPOTrainer) and isinstance(trainer.args, DPOConfig)
    assert trainer.args.beta == 0.2 and trainer.args.loss_type == ["sigmoid", "sft"]
    assert trainer.args.loss_weights == [1.0, 0.5] and trainer.args.max_length == 64
    assert not trainer.args.gradient_checkpointing  # the recipe's choice, not TRL's default of True
    reference = trainer.ref_model
    assert reference is not None and reference is not trainer.model
    assert not any(p.requires_grad for p in reference.parameters())
    assert data.data_format == "preference" and len(data.train) == 4 and data.truncated == data.dropped == 0


def test_lora_dpo_uses_the_model_with_its_adapter_disabled_as_the_reference(tmp_path, demo_model_path):
    trainer, _ = build(make_recipe(tmp_path, CHAT_PAIRS, method="lora"), tmp_path)
    assert trainer.ref_model is None
    assert list(trainer.model.peft_config) == ["default"]  # no second, frozen "ref" adapter


def test_precomputed_reference_scores_every_pair_before_training(tmp_path, demo_model_path):
    trainer, _ = build(make_recipe(tmp_path, CHAT_PAIRS, settings={"precompute_ref_log_probs": True}), tmp_path)
    assert trainer.ref_model is None
    assert {"ref_chosen_logps", "ref_rejected_logps"} <= set(trainer.train_dataset.column_names)


def test_kto_trains_on_labelled_completions(tmp_path, demo_model_path):
    from trl import KTOTrainer

    trainer, data = build(make_recipe(tmp_path, UNPAIRED, objective="kto"), tmp_path)
    assert isinstance(trainer, KTOTrainer) and trainer.args.loss_type == "kto"
    assert data.data_format == "unpaired_preference" and trainer.ref_model is not None


def test_prompts_that_fill_max_seq_length_are_refused_before_training(tmp_path, demo_model_path):
    from tuner.data.sources import DataError

    with pytest.raises(DataError, match="every prompt of the 4 training samples fills 8 tokens"):
        build(make_recipe(tmp_path, CHAT_PAIRS, max_seq_length=8), tmp_path)


def test_resume_is_refused_across_objectives_and_old_checkpoints_count_as_sft(tmp_path):
    sft = load_recipe(builtin_path("demo"))
    dpo = load_recipe(builtin_path("demo-dpo"))
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    (checkpoint / CHECKPOINT_INFO).write_text(json.dumps({"step": 4, "settings": resume_settings(sft, 1)}))
    with pytest.raises(CheckpointRefused, match="objective.kind: saved with 'sft', the recipe now has 'dpo'"):
        check_resumable(dpo, checkpoint, 1)
    older = {key: value for key, value in resume_settings(sft, 1).items() if key != "objective.kind"}
    (checkpoint / CHECKPOINT_INFO).write_text(json.dumps({"step": 4, "settings": older}))
    check_resumable(sft, checkpoint, 1)  # saved before objectives existed: SFT
    with pytest.raises(CheckpointRefused, match="objective.kind: saved with 'sft'"):
        check_resumable(dpo, checkpoint, 1)


def test_demo_starts_from_the_sft_recipe_it_names(tmp_path, monkeypatch):
    from tuner.recipe.registry import starting_recipe

    monkeypatch.chdir(tmp_path)
    dpo = load_recipe(builtin_path("demo-dpo"))
    assert starting_recipe(dpo).name == "demo"  # model.id is runs/demo/final, not there yet
    (tmp_path / "runs" / "demo" / "final").mkdir(parents=True)
    assert starting_recipe(dpo) is None  # already trained: start from it
    assert starting_recipe(load_recipe(builtin_path("demo"))) is None


def eval_metric(events: list[dict], key: str) -> list[float]:
    return [event[f"eval_{key}"] for event in events if event["event"] == "eval" and f"eval_{key}" in event]


@pytest.mark.slow
@pytest.mark.xdist_group("trained-demo")
def test_demo_dpo_after_sft_raises_held_out_reward_accuracy_and_margin(trained_demo, tuner_cli):
    """`tuner run demo` (the shared trained demo), then `tuner run demo-dpo` from its result, in the same directory."""
    workdir = trained_demo.parent.parent  # where `tuner run demo` ran: demo-dpo's model.id is runs/demo/final
    dpo = tuner_cli("run", "demo-dpo", "--set", "training.max_steps=12", "--set", "training.eval_steps=6",
                    "--set", "data.max_samples=320", "--set", "training.micro_batch_size=8", cwd=workdir, timeout=300)
    assert dpo.returncode == 0, dpo.stdout + dpo.stderr
    run_dir = workdir / "runs" / "demo-dpo"
    events = read_records(run_dir / "events.jsonl")
    accuracy, margin = eval_metric(events, "rewards/accuracies"), eval_metric(events, "rewards/margins")
    assert len(accuracy) == len(margin) == 3  # before training (step 0), at step 6 and at the end
    assert accuracy[0] == margin[0] == 0  # the model is its own reference before the first step
    assert accuracy[-1] > 0.5 and margin[-1] > margin[1] > 0, (accuracy, margin)
    steps = [e for e in events if e["event"] == "step" and "rewards/margins" in e]
    assert steps and all("rewards/accuracies" in e for e in steps)
    finished = events[-1]
    assert finished["event"] == "finished" and finished["step"] == 12 and "eval_rewards/margins" in finished
    assert (run_dir / "final" / "model.safetensors").is_file()
    assert "memory: plan predicted" in dpo.stdout

    from tuner.commands.demo import _reward_lines

    reward, logps = _reward_lines(run_dir)
    assert reward.startswith(f"held-out reward accuracy 0.0% -> {accuracy[-1]:.1%}, reward margin 0.000 -> ")
    assert logps.startswith("held-out log-probability of the chosen answers ")
    assert Path(run_dir / "final" / "recipe.lock.yaml").is_file()
