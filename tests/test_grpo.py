"""GRPO (online RL) through TRL's GRPOTrainer: the recipe mapped to GRPOConfig, the rewards and their failures, the
prompt data, and (slow) real runs: demo-grpo after the SFT demo, and two ranks that stop together on a bad reward."""
from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path

import pytest
from conftest import library_noise
from hypothesis import assume, given, settings, strategies as st

from tuner.data.prompts import ROW_COLUMN
from tuner.rundir.events import read_records
from tuner.recipe.io import load_recipe, validate_recipe
from tuner.recipe.registry import builtin_path

PROMPTS = [{"prompt": [{"role": "user", "content": f"reverse\n{word}"}], "answer": word[::-1]}
           for word in ("abc", "wxyz", "qrs", "mno")]
REWARD = {"kind": "exact_match", "column": "answer"}


def make_recipe(tmp_path, rows=PROMPTS, method="full", grpo=None, objective=None, memory=None, **sections):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return validate_recipe({
        "model": {"id": "builtin:demo", "dtype": "float32"},
        "objective": {"kind": "grpo", **(objective or {}),
                      "grpo": {"num_generations": 2, "max_prompt_length": 16, "max_completion_length": 8,
                               "rewards": [REWARD], **(grpo or {})}},
        "method": {"kind": method},
        "memory": {"mixed_precision": "no", "micro_batch_size": 4, "max_seq_length": 24, **(memory or {})},
        "data": {"source": str(data), "eval_fraction": 0},
        "output": {"dir": str(tmp_path / "run")},
        **sections,
    })


def build(recipe, tmp_path):
    from tuner.loading.model import load_tokenizer
    from tuner.train.__main__ import training_arguments
    from tuner.train.grpo import grpo_trainer

    return grpo_trainer(recipe, training_arguments(recipe, tmp_path), load_tokenizer(recipe), [])


# -- the recipe, as GRPOConfig takes it ----------------------------------------------------------------------------

def test_every_grpo_setting_reaches_grpo_config(tmp_path):
    from trl import GRPOConfig

    from tuner.train.__main__ import training_arguments

    recipe = make_recipe(tmp_path, objective={"beta": 0.04, "loss_type": "dr_grpo"}, memory={
        "gradient_accumulation_steps": 2}, grpo={"num_generations": 4, "steps_per_generation": 4, "temperature": 0.8,
                                                 "top_p": 0.9, "importance_sampling_level": "sequence",
                                                 "rewards": [REWARD, {"kind": "length", "weight": 0.5}]},
        training={"learning_rate": 3e-5})
    args = training_arguments(recipe, tmp_path)
    assert isinstance(args, GRPOConfig)
    assert (args.beta, args.loss_type, args.num_generations, args.max_completion_length) == (0.04, "dr_grpo", 4, 8)
    assert (args.temperature, args.top_p, args.importance_sampling_level) == (0.8, 0.9, "sequence")
    assert args.steps_per_generation == 4 and args.generation_batch_size == 16  # micro-batch 4 x 1 rank x 4
    assert args.reward_weights == [1.0, 0.5] and args.disable_dropout and not args.use_vllm
    # the same TrainingArguments values as SFT and DPO, not GRPOConfig's defaults (1e-6, checkpointing, bf16)
    assert args.learning_rate == 3e-5 and not args.gradient_checkpointing and not args.bf16
    assert args.per_device_train_batch_size == 4 and args.gradient_accumulation_steps == 2
    assert args.include_num_input_tokens_seen == "no"


def test_defaults_follow_the_memory_section(tmp_path):
    recipe = validate_recipe({"objective": {"kind": "grpo", "grpo": {"rewards": [REWARD]}},
                              "memory": {"micro_batch_size": 8, "max_seq_length": 1024,
                                         "gradient_accumulation_steps": 2}, "data": {"eval_fraction": 0}})
    grpo = recipe.objective.grpo
    assert recipe.objective.beta == 0.0 and recipe.objective.loss_type == "dapo"  # TRL's defaults
    assert (grpo.max_completion_length, grpo.max_prompt_length, grpo.steps_per_generation) == (512, 512, 2)
    assert validate_recipe({"objective": {"kind": "dpo"}}).objective.beta == 0.1


def test_vllm_modes_reach_grpo_config(tmp_path):
    from tuner.train.grpo import grpo_arguments

    gpus = {"gpus_per_machine": 1, "gpu": "H100-80GB"}
    _, colocate = grpo_arguments(make_recipe(tmp_path, hardware=gpus, grpo={
        "generation": "vllm_colocate", "vllm_gpu_memory_utilization": 0.25, "vllm_sleep_mode": True}))
    assert colocate["use_vllm"] and colocate["vllm_mode"] == "colocate"
    assert colocate["vllm_gpu_memory_utilization"] == 0.25 and colocate["vllm_enable_sleep_mode"]
    _, server = grpo_arguments(make_recipe(tmp_path, hardware=gpus, grpo={"generation": "vllm_server",
                                                                          "vllm_server_port": 8123}))
    assert server["vllm_mode"] == "server" and server["vllm_server_port"] == 8123
    assert server["vllm_server_host"] == "127.0.0.1"


# -- the trainer: reference, prompts ---------------------------------------------------------------------------------

def test_reference_model_only_with_a_kl_penalty_and_full_weights(tmp_path, demo_model_path):
    from trl import GRPOTrainer

    trainer, data = build(make_recipe(tmp_path), tmp_path)
    assert isinstance(trainer, GRPOTrainer) and trainer.ref_model is None  # beta 0: TRL loads none
    assert data.data_format == "prompt" and len(data.train) == 4 and data.dropped == 0
    assert ROW_COLUMN in data.train.column_names  # each prompt's row, for a reward's failure
    trainer, _ = build(make_recipe(tmp_path, objective={"beta": 0.1}), tmp_path)
    assert trainer.ref_model is not None and not any(p.requires_grad for p in trainer.ref_model.parameters())
    trainer, _ = build(make_recipe(tmp_path, objective={"beta": 0.1}, method="lora"), tmp_path)
    assert trainer.ref_model is None  # the adapter disabled is the reference


def test_prompts_longer_than_max_prompt_length_are_dropped_and_counted(tmp_path, demo_model_path):
    from tuner.data.sources import DataError

    rows = PROMPTS + [{"prompt": "reverse\n" + "x" * 40, "answer": "x" * 40}]
    _, data = build(make_recipe(tmp_path, rows), tmp_path)
    assert data.dropped == 1 and len(data.train) == 4
    with pytest.raises(DataError, match="every one of the 5 training prompts is longer than 2 tokens"):
        build(make_recipe(tmp_path, rows, grpo={"max_prompt_length": 2}), tmp_path)


def test_a_prompt_row_that_cannot_be_a_prompt_is_named_by_its_line(tmp_path):
    from tuner.data.prepare import check_data
    from tuner.data.sources import DataError

    rows = PROMPTS + [{"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                       "answer": "x"}, {"answer": "y"}]
    with pytest.raises(DataError) as caught:
        check_data(make_recipe(tmp_path, rows))
    message = str(caught.value)
    assert "prompts.jsonl:5: 'prompt' ends with the assistant's turn" in message
    assert "line 6 ('prompt' is missing" in message


def test_a_reward_column_the_data_lacks_is_refused(tmp_path):
    from tuner.data.prepare import check_data
    from tuner.data.sources import DataError

    recipe = make_recipe(tmp_path, grpo={"rewards": [{"kind": "exact_match", "column": "solution"}]})
    with pytest.raises(DataError, match=r"objective.grpo.rewards.0.column: exact_match reads the column 'solution', "
                                        r"which .*prompts.jsonl lacks \(its columns: answer, prompt\)"):
        check_data(recipe)


@pytest.mark.slow
def test_preview_shows_each_prompt_and_its_reward_inputs(tuner_cli, demo_model_path):
    preview = tuner_cli("data", "preview", "demo-grpo", "--set", "model.id=builtin:demo", "-n", "2")
    assert preview.returncode == 0, preview.stderr
    assert "grpo: 8 completions of up to 8 tokens are sampled after each prompt" in " ".join(preview.stdout.split())
    assert preview.stdout.count("reward inputs: answer='") == 2 and "a prompt of " in preview.stdout
    assert "«reverse\n" in preview.stdout and ROW_COLUMN not in preview.stdout



def test_reverse_run_prompts_are_words_no_other_builtin_source_holds():
    """A letter, then a run of another: every such word of 5 and 6 letters, none in the SFT data, pairs or prompts."""
    from tuner.data.reverse import _GENERATORS, BUILTIN_DATASETS

    prompts = _GENERATORS["builtin:reverse-run-prompts"](BUILTIN_DATASETS["builtin:reverse-run-prompts"])
    words = [prompt["prompt"][0]["content"].removeprefix("reverse\n") for prompt in prompts]
    assert len(set(words)) == len(words) == 26 * 25 * 2
    assert all(re.fullmatch(r"([a-z])(?!\1)([a-z])\2{3,4}", word) for word in words), words[:5]
    assert [prompt["answer"] for prompt in prompts] == [word[::-1] for word in words]
    others = [source for source in BUILTIN_DATASETS  # the word sources (builtin:shapes holds pictures)
              if source.startswith("builtin:reverse") and source != "builtin:reverse-run-prompts"]
    assert {"builtin:reverse", "builtin:reverse-pairs", "builtin:reverse-prompts"} <= set(others)
    for source in others:  # every word of their samples, prompts and answers alike
        held = set(re.findall(r"[a-z]+", json.dumps(_GENERATORS[source](BUILTIN_DATASETS[source]))))
        assert len(held) > 1000 and not held & set(words), source

# -- rewards --------------------------------------------------------------------------------------------------------

def reward_section(**fields):
    from tuner.recipe.objective import RewardSection

    return RewardSection(**fields)


def test_builtin_rewards_score_completions():
    from tuner.train.rewards import builtin_reward

    chat = [[{"role": "assistant", "content": " cba "}], [{"role": "assistant", "content": "abc"}]]
    exact = builtin_reward(reward_section(kind="exact_match", column="answer"), 8)
    assert exact(completions=chat, answer=["cba", "cba"]) == [1.0, 0.0]
    regex = builtin_reward(reward_section(kind="regex_match", column="answer", pattern=r"<a>(\d+)</a>"), 8)
    assert regex(completions=["so <a>42</a>", "<a>4</a>", "none"], answer=[42, 42, 42]) == [1.0, 0.0, 0.0]
    form = builtin_reward(reward_section(kind="format", pattern=r"[a-z]+"), 8)
    assert form(completions=["abc", "ab c"]) == [1.0, 0.0]
    length = builtin_reward(reward_section(kind="length", target_tokens=2), 8)
    assert length(completion_ids=[[1], [1, 2, 3, 4]]) == [0.0, -0.25]


def test_think_format_rewards_reasoning_in_one_think_block_before_the_answer():
    from tuner.train.rewards import builtin_reward

    think = builtin_reward(reward_section(kind="think_format"), 8)
    completions = ["<think>\n2 + 2 is 4\n</think>\nThe answer is 4.", [{"role": "assistant", "content": "<think>x</think>4"}],
                   "The answer is 4.", "<think>unclosed, 4", "<think>a</think><think>b</think>4", " <think>a</think>4"]
    assert think(completions=completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
def test_think_format_holds_for_any_reasoning_and_answer_without_another_think_tag(reasoning, answer):
    from tuner.train.rewards import builtin_reward

    think = builtin_reward(reward_section(kind="think_format"), 8)
    assume("<think>" not in reasoning + answer and "</think>" not in reasoning)
    assert think(completions=[f"<think>{reasoning}</think>{answer}", f"{reasoning}{answer}"]) == [1.0, 0.0]


def test_a_math_reward_checks_answers_with_trls_checker_or_names_the_package_it_needs(tmp_path):
    import importlib.util

    from tuner.train.rewards import RewardError, builtin_reward, reward_functions

    recipe = validate_recipe({"objective": {"kind": "grpo", "grpo": {"rewards": [
        {"kind": "think_format"}, {"kind": "math", "column": "solution"}]}},
        "data": {"source": "builtin:reverse-prompts"}, "training": {"micro_batch_size": 8}})
    if importlib.util.find_spec("math_verify") is None:  # refused before training, naming the field and the fix
        with pytest.raises(RewardError, match=r"objective.grpo.rewards.1.kind: .*pip install 'math-verify"):
            reward_functions(recipe)
        return
    math_reward = builtin_reward(reward_section(kind="math", column="solution"), 8)
    completions = ["so \\boxed{\\frac{1}{2}}", [{"role": "assistant", "content": "The answer is $0.5$"}], "\\boxed{0.5}",
                   "$0.5$", "\\boxed{3}", "no idea"]  # a bare $0.5$ has no anchor TRL's checker extracts an answer at
    assert math_reward(completions=completions, solution=["$\\frac{1}{2}$"] * 6) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def checked(function, user=True, time_limit_s=5.0):
    from tuner.train.rewards import CheckedReward

    return CheckedReward(function, "my_reward", 1, "prompts.jsonl", user, time_limit_s)


BATCH = dict(prompts=["p1", "p2", "p3"], completions=["a", "b", "c"], completion_ids=[[1], [2], [3]],
             answer=["a", "x", "c"])


def test_a_reward_that_raises_names_the_reward_and_the_prompt():
    from tuner.train.rewards import RewardError

    def fails_on_b(completions, **_):
        return [1 / 0 if completion == "b" else 1.0 for completion in completions]

    with pytest.raises(RewardError) as caught:
        checked(fails_on_b)(**BATCH, **{ROW_COLUMN: [7, 12, 3]})
    message = str(caught.value)
    assert message.startswith("objective.grpo.rewards.1: the reward 'my_reward' raised ZeroDivisionError: division by "
                              "zero on a completion of prompt row 12 of prompts.jsonl ('p2')")


@pytest.mark.parametrize("values, problem", [
    ([1.0, 2.0], "returned 2 values for 3 completions"),
    ([1.0, "good", 0.0], "returned str 'good', not a number"),
    ([1.0, 0.0, math.inf], "returned inf, not a finite number"),
    ([math.nan, 0.0, 1.0], "returned nan, not a finite number"),  # docs/training.md: NaN stops the run too
    ([1.0, -math.inf, 1.0], "returned -inf, not a finite number"),
])
def test_a_reward_of_the_wrong_length_or_not_numbers_stops_the_run(values, problem):
    from tuner.train.rewards import RewardError

    with pytest.raises(RewardError, match=problem):
        checked(lambda **_: values)(**BATCH, **{ROW_COLUMN: [1, 2, 3]})


def test_a_reward_call_past_its_time_limit_stops_the_run_naming_it():
    from tuner.train.rewards import RewardError

    release = threading.Event()
    try:
        with pytest.raises(RewardError, match=r"objective\.grpo\.rewards\.1: the reward 'my_reward' did not return "
                                              r"within 0\.2 s \(objective\.grpo\.reward_time_limit_s\) scoring 3 "
                                              r"completions, the first on a completion of prompt row 1 of prompts"
                                              r"\.jsonl \('p1'\); make it faster or raise"):
            checked(lambda **_: release.wait(), time_limit_s=0.2)(**BATCH, **{ROW_COLUMN: [1, 2, 3]})
    finally:
        release.set()  # the abandoned call returns; a rank would have left with os._exit


def test_a_reward_that_calls_sys_exit_is_refused_not_the_end_of_the_rank():
    """Found by benchmarks/hostile_inputs.py: SystemExit is no Exception, and ended the rank with the reward's code."""
    import sys

    from tuner.train.rewards import RewardError

    with pytest.raises(RewardError, match="the reward 'my_reward' raised SystemExit: 3 on a completion of prompt row 1"):
        checked(lambda **_: sys.exit(3))(**BATCH, **{ROW_COLUMN: [1, 2, 3]})


def test_a_reward_runs_with_the_callers_grad_mode_and_its_exceptions():
    import torch

    seen = []

    def reward(completions, **_):
        seen.append(torch.is_grad_enabled())
        return [0.0] * len(completions)

    with torch.no_grad():
        checked(reward)(**BATCH, **{ROW_COLUMN: [1, 2, 3]})
    checked(reward)(**BATCH, **{ROW_COLUMN: [1, 2, 3]})
    assert seen == [False, True]


def test_none_means_not_applicable_and_columns_reach_the_function():
    seen = {}

    def reward(prompts, completions, completion_ids, answer, **context):
        seen.update(context, answer=answer)
        return [None, 1, 0.5]

    values = checked(reward)(**BATCH, **{ROW_COLUMN: [1, 2, 3]}, trainer_state="state")
    assert math.isnan(values[0]) and values[1:] == [1.0, 0.5]
    assert seen == {"answer": ["a", "x", "c"], "trainer_state": "state"}  # tuner's row column stays out


BAD = Path(__file__).parent / "data" / "bad_recipes"


def test_a_user_reward_is_read_by_the_checks_and_imported_only_to_train(tmp_path):
    """The fixture file raises when run: validating a recipe that names it must not run it; training does."""
    from tuner.train.rewards import RewardError, reward_functions

    function = f"{BAD / 'reward_functions.py'}:shorter_is_better"
    (tmp_path / "recipe.yaml").write_text(
        f"objective:\n  kind: grpo\n  grpo:\n    num_generations: 2\n    rewards:\n"
        f"      - {{kind: function, function: '{function}'}}\nmemory:\n  micro_batch_size: 2\n")
    recipe = load_recipe(tmp_path / "recipe.yaml")
    with pytest.raises(RewardError, match="importing .*reward_functions.py failed: RuntimeError: the recipe checks "
                                          "must not run this file"):
        reward_functions(recipe)


def test_a_user_reward_next_to_the_recipe_scores_completions(tmp_path):
    from tuner.train.rewards import reward_functions

    (tmp_path / "scoring.py").write_text("def longer(prompts, completions, completion_ids, **columns):\n"
                                         "    return [len(ids) for ids in completion_ids]\n")
    (tmp_path / "recipe.yaml").write_text(
        "objective:\n  kind: grpo\n  grpo:\n    num_generations: 2\n    rewards:\n"
        "      - {kind: function, function: scoring.py:longer, weight: 2}\n      - {kind: exact_match, column: answer}\n"
        "memory:\n  micro_batch_size: 2\n")
    recipe = load_recipe(tmp_path / "recipe.yaml")
    functions, tokenizers = reward_functions(recipe)
    assert [f.__name__ for f in functions] == ["longer", "exact_match(answer)"] and tokenizers == [None, None]
    assert functions[0](**BATCH, **{ROW_COLUMN: [1, 2, 3]}) == [1.0, 1.0, 1.0]


def test_a_reward_model_scores_beside_the_functions(tmp_path, demo_model_path):
    """A sequence-classification checkpoint as a reward: loaded frozen in model.dtype with its tokenizer, handed to
    TRL (which runs it on prompt + completion)."""
    import shutil

    from transformers import AutoConfig, AutoModelForSequenceClassification

    reward_dir = tmp_path / "reward-model"
    config = AutoConfig.from_pretrained(demo_model_path, num_labels=1)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(reward_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (demo_model_path / name).is_file():
            shutil.copy(demo_model_path / name, reward_dir / name)
    recipe = make_recipe(tmp_path, grpo={"rewards": [REWARD, {"kind": "model", "model": str(reward_dir),
                                                                "weight": 0.5}]})
    trainer, _ = build(recipe, tmp_path)
    assert trainer.reward_func_names == ["exact_match(answer)", "reward-model"]
    model, tokenizer = trainer.reward_funcs[1], trainer.reward_processing_classes[1]
    assert not any(p.requires_grad for p in model.parameters()) and tokenizer is not None
    assert trainer.reward_weights.tolist() == [1.0, 0.5]


def test_the_run_screen_and_the_progress_line_show_the_reward():
    from tuner.rundir.events import describe, parse_event
    from tuner.tui.run_watch import RunWatch
    from tuner.tui.screens.run import status_line

    event = parse_event({"event": "step", "step": 5, "max_steps": 10, "loss": 0.01, "reward": 0.75, "reward_std": 0.25,
             "kl": 0.002, "completions/mean_length": 6.5, "time": 1.0})
    assert "reward 0.750 ± 0.250  kl 0.0020  completion 6.5 tokens" in describe(event)
    assert "eval reward 0.800" in describe(parse_event({"event": "eval", "step": 5, "eval_reward": 0.8}))
    watch = RunWatch(run_dir=Path("run"))
    watch.absorb([event])
    assert "reward 0.750 ± 0.250" in status_line(watch)


# -- real runs ------------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.xdist_group("trained-demo")
def test_demo_grpo_after_sft_raises_the_held_out_reward(trained_demo, tuner_cli):
    """`tuner run demo` (the shared trained demo), then `tuner demo --recipe demo-grpo` from its result."""
    workdir = trained_demo.parent.parent  # demo-grpo's model.id is runs/demo/final
    demo = tuner_cli("demo", "--recipe", "demo-grpo", "-o", "runs/grpo", cwd=workdir, timeout=900)  # as shipped
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    events = read_records(workdir / "runs" / "grpo" / "events.jsonl")
    steps = [e for e in events if e["event"] == "step" and "reward" in e]
    assert steps and all({"reward", "reward_std", "kl", "completions/mean_length"} <= set(e) for e in steps)
    rewards = [e["eval_reward"] for e in events if e["event"] == "eval" and "eval_reward" in e]
    assert len(rewards) == 2 and rewards[-1] > rewards[0], rewards
    assert "reward " in demo.stdout and " kl " in demo.stdout  # the progress line
    line = next(line for line in demo.stdout.splitlines() if line.startswith("held-out mean reward "))
    assert line.startswith(f"held-out mean reward {rewards[0]:.3f} -> {rewards[-1]:.3f}")
    scored = [re.search(r"^(before|after) training: held-out greedy reward ([-\d.]+), exact match\(answer\) ([\d.]+)%",
                        line) for line in demo.stdout.splitlines()]  # tuner eval's held-out task, the recipe's reward
    (_, before, before_match), (_, after, after_match) = (found.groups() for found in scored if found)
    assert float(after) > float(before) and float(after_match) > float(before_match), demo.stdout
    assert list((workdir / "runs" / "grpo" / "eval").glob("eval-*.json")), "saved as tuner eval saves"
    # quiet: only tuner's lines reach the user; the libraries' own output is in the run's log
    assert not library_noise(demo.stdout + demo.stderr), (demo.stdout + demo.stderr)[-4000:]
    assert "Running generate_until requests" in (workdir / "runs" / "grpo" / "train.log").read_text()
    timed, finished = demo.stdout.splitlines()[-2:]  # where the time went, phase by phase
    assert re.fullmatch(r"time: checks \d+ s, scoring before \d+ s, grpo training \d+ s, scoring after \d+ s, "
                        r"saving \d+ s", timed), timed
    assert finished.startswith("demo finished in ")


def two_rank_recipe(tmp_path, reward: str, memory: str = "distributed: ddp", processes: int = 2, grpo: str = ""
                    ) -> Path:
    """A grpo recipe of 2 gloo ranks (or ``processes``) on the demo model, 4 steps."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "name: ranks\nmodel: {id: builtin:demo, dtype: float32}\nobjective:\n  kind: grpo\n  beta: 0.04\n  grpo:\n"
        "    num_generations: 2\n    max_prompt_length: 16\n    max_completion_length: 4\n"
        f"    rewards: [{reward}]\n{grpo}"
        f"hardware: {{num_processes: {processes}}}\nmemory: {{{memory}, mixed_precision: 'no', micro_batch_size: 2, "
        "max_seq_length: 24}\n"
        f"data: {{source: {data}, eval_fraction: 0}}\ntraining: {{max_steps: 4, logging_steps: 1}}\n")
    return recipe


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
@pytest.mark.parametrize("memory", ["distributed: ddp", "distributed: deepspeed, zero_stage: 2"],
                         ids=["ddp", "zero2"])
def test_grpo_trains_on_two_ranks(tmp_path, tuner_cli, demo_model_path, memory):
    recipe = two_rank_recipe(tmp_path, "{kind: exact_match, column: answer}", memory)
    run = tuner_cli("run", str(recipe), "--set", f"output.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    events = read_records(tmp_path / "run" / "events.jsonl")
    assert events[-1]["event"] == "finished" and events[-1]["step"] == 4
    steps = [e for e in events if e["event"] == "step" and "reward" in e]
    assert steps and all("kl" in e and len(e["peak_rss_gib_per_rank"]) == 2 for e in steps)


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
def test_a_failing_reward_stops_both_ranks_naming_it(tmp_path, tuner_cli, demo_model_path):
    """Two gloo ranks under DDP; the user's reward fails on one prompt, which only one rank holds: both stop, each with
    exit code 2 and an error event, which is what the launcher reports (naming the rank)."""
    (tmp_path / "rewards.py").write_text("def picky(prompts, completions, completion_ids, answer, **_):\n"
                                         "    if 'zyxw' in answer:\n        raise ValueError('no such word')\n"
                                         "    return [0.0] * len(completions)\n")
    recipe = two_rank_recipe(tmp_path, "{kind: function, function: rewards.py:picky}")
    run = tuner_cli("run", str(recipe), "--set", f"output.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 2 and re.search(r"rank [01] failed: objective\.grpo\.rewards\.0: the reward 'picky' raised "
                                             "ValueError: no such word", output), output[-2000:]
    errors = [e for e in read_records(tmp_path / "run" / "events.jsonl") if e["event"] == "error"]
    assert sorted(e["rank"] for e in errors) == [0, 1]
    for error in errors:
        assert "the reward 'picky' raised ValueError: no such word on a completion of prompt row 2 of " in \
            error["message"]


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
def test_a_reward_that_never_returns_stops_both_ranks_naming_it(tmp_path, tuner_cli, demo_model_path):
    """The reward hangs on a prompt only one rank holds: that rank's call is given up after the limit, and both
    ranks stop with exit code 2, each naming the reward (the other one waited in the ranks' agreement)."""
    (tmp_path / "rewards.py").write_text("import time\n\ndef stuck(prompts, completions, completion_ids, answer, **_):\n"
                                         "    if 'zyxw' in answer:\n        time.sleep(100000)\n"
                                         "    return [0.0] * len(completions)\n")
    recipe = two_rank_recipe(tmp_path, "{kind: function, function: rewards.py:stuck}",
                             grpo="    reward_time_limit_s: 3\n")
    run = tuner_cli("run", str(recipe), "--set", f"output.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 2 and "the reward 'stuck' did not return within 3 s (objective.grpo.reward_time_limit_s)" \
        in output, output[-2000:]
    errors = [e for e in read_records(tmp_path / "run" / "events.jsonl") if e["event"] == "error"]
    assert sorted(e["rank"] for e in errors) == [0, 1] and all("'stuck' did not return" in e["message"] for e in errors)


@pytest.mark.slow
def test_a_reward_of_the_wrong_length_exits_2_as_the_docs_say(tmp_path, tuner_cli, demo_model_path):
    (tmp_path / "rewards.py").write_text("def short(prompts, completions, completion_ids, **_):\n"
                                         "    return [0.0] * (len(completions) - 1)\n")
    recipe = two_rank_recipe(tmp_path, "{kind: function, function: rewards.py:short}", processes=1)
    run = tuner_cli("run", str(recipe), "--set", f"output.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert run.returncode == 2 and "the reward 'short' returned 1 values for 2 completions" in run.stdout + run.stderr


# -- vLLM: rendered and checked, not run here -------------------------------------------------------------------------

SERVER = {"gpus_per_machine": 2, "gpu": "H100-80GB"}


def test_launch_script_starts_the_vllm_server_on_its_own_gpus(tmp_path):
    import subprocess

    from tuner.render.run_directory import render_run_files
    from tuner.rundir.layout import LAUNCH_SCRIPT, SLURM_SCRIPT

    recipe = make_recipe(tmp_path, hardware=SERVER, memory={"distributed": "ddp", "micro_batch_size": 2},
                         grpo={"generation": "vllm_server", "vllm_server_gpus": 2, "vllm_server_port": 8123})
    files = render_run_files(recipe, "runs/served")
    script = files[LAUNCH_SCRIPT]
    assert ('CUDA_VISIBLE_DEVICES="${TUNER_VLLM_GPUS:-2,3}" trl vllm-serve --model builtin:demo '
            "--tensor_parallel_size 2 --port 8123 --gpu_memory_utilization 0.3 --max_model_len 24 &") in script
    assert 'export CUDA_VISIBLE_DEVICES="${TUNER_TRAINING_GPUS:-0,1}"' in script
    assert script.index("trl vllm-serve") < script.index("accelerate launch")
    assert "#SBATCH --gpus-per-node=4" in files[SLURM_SCRIPT]  # the training GPUs and the server's
    (tmp_path / "launch.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "launch.sh")]).returncode == 0
    colocated = render_run_files(make_recipe(tmp_path, hardware=SERVER, memory={"distributed": "ddp"},
                                             grpo={"generation": "vllm_colocate"}), "runs/colocated")
    assert "vllm-serve" not in colocated[LAUNCH_SCRIPT]


def fake_vllm(root: Path, version: str) -> None:
    """An installed-looking vllm package of ``version`` (its module and its distribution's metadata)."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    info = root / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")


def test_doctor_checks_vllm_against_the_versions_trl_supports(tmp_path, monkeypatch):
    import importlib
    import importlib.util
    import sys

    from tuner.doctor import check_vllm

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    recipe = make_recipe(tmp_path, hardware={"gpus_per_machine": 1, "gpu": "H100-80GB"},
                         grpo={"generation": "vllm_colocate"})
    missing = check_vllm(recipe)
    assert missing.status == "fail" and "objective.grpo.generation: vllm_colocate needs it" in missing.detail
    assert check_vllm(None).status == "ok" and check_vllm(make_recipe(tmp_path)).status == "ok"
    for version, status in (("0.40.0", "fail"), ("0.25.1", "ok")):
        root = tmp_path / version
        fake_vllm(root, version)
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        found = check_vllm(recipe)
        assert found.status == status, found
        if status == "fail":
            assert "TRL currently supports vLLM versions from 0.22.0 to 0.31.0" in found.detail
        monkeypatch.undo()
        sys.modules.pop("vllm", None)  # TRL imported the fake to read its version
        importlib.invalidate_caches()
