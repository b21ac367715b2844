"""Preference data (dpo, kto): layouts as text or conversations, row checks by file line before any training, the
tokens TRL trains on (tuner's preview against TRL's own tokenisation) and the demo's preference pairs.

No training here; the demo tokenizer (and, for the TRL comparison, the demo model) load in-process.
"""
from __future__ import annotations

import json

import pytest

from tuner.data.preference import encode_completions
from tuner.data.prepare import split_samples
from tuner.data.reverse import BUILTIN_DATASETS, reverse_pairs, reverse_samples
from tuner.data.sources import DataError
from tuner.recipe.io import validate_recipe


def user(text):
    return [{"role": "user", "content": text}]


def assistant(text):
    return [{"role": "assistant", "content": text}]


TEXT_PAIR = {"prompt": "reverse\nabc=", "chosen": "cba", "rejected": "cab"}
CHAT_PAIR = {"prompt": user("reverse\nabc"), "chosen": assistant("cba"), "rejected": assistant("cab")}
IMPLICIT_PAIR = {"chosen": user("reverse\nabc") + assistant("cba"), "rejected": user("reverse\nabc") + assistant("cab")}
UNPAIRED = [{"prompt": "reverse\nabc=", "completion": "cba", "label": True},
            {"prompt": "reverse\nxyz=", "completion": "zxy", "label": False}]


def recipe_for(path, objective="dpo", **data):
    return validate_recipe({
        "model": {"id": "builtin:demo", "dtype": "float32"},
        "objective": {"kind": objective},
        "memory": {"mixed_precision": "no", "max_seq_length": data.pop("max_seq_length", 64), "micro_batch_size": 2},
        "data": {"source": str(path), "eval_fraction": 0, **data},
    })


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def tokenizer(demo_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model_path)


@pytest.mark.parametrize("pair", [TEXT_PAIR, CHAT_PAIR, IMPLICIT_PAIR], ids=["text", "conversation", "implicit-prompt"])
def test_pairs_as_text_or_conversations_are_read_as_preference_data(tmp_path, pair):
    train, _, data_format = split_samples(recipe_for(write_jsonl(tmp_path / "p.jsonl", [pair] * 3)))
    assert data_format == "preference" and len(train) == 3


def test_bad_pairs_are_named_by_file_line_before_training(tmp_path):
    rows = [CHAT_PAIR,
            {**CHAT_PAIR, "chosen": assistant("  ")},
            {**TEXT_PAIR, "rejected": ""},
            {**CHAT_PAIR, "rejected": assistant("cba")},
            {**TEXT_PAIR, "rejected": " cba "},
            {**TEXT_PAIR, "chosen": assistant("cba")},
            {"chosen": "cba", "rejected": "cab", "prompt": None},
            {"chosen": assistant("cba"), "rejected": assistant("cab")}]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    with pytest.raises(DataError) as caught:
        split_samples(recipe_for(path))
    message = str(caught.value)
    assert message.startswith(f"data.source: {path}:2: 'chosen' is empty; 6 more of 8 rows cannot be used: ")
    assert "line 3 ('rejected' is empty)" in message
    assert "line 4 ('chosen' and 'rejected' are the same answer" in message
    assert "line 5 ('chosen' and 'rejected' are the same answer" in message
    assert "line 6 ('chosen' and 'rejected' mix text and messages" in message
    assert "line 7 ('prompt' is missing" in message and "(and 1 more)" in message  # line 8: nothing shared
    with pytest.raises(DataError, match="t.jsonl:1: 'prompt' is missing \\(text pairs need it"):
        split_samples(recipe_for(write_jsonl(tmp_path / "t.jsonl", [rows[6]])))
    with pytest.raises(DataError, match="c.jsonl:1: no 'prompt', and 'chosen' and 'rejected' share no opening turn"):
        split_samples(recipe_for(write_jsonl(tmp_path / "c.jsonl", [rows[7]])))


def test_missing_columns_name_the_objective_and_preference_columns_hint_sft_users(tmp_path):
    path = write_jsonl(tmp_path / "half.jsonl", [{"prompt": "a", "chosen": "b"}])
    with pytest.raises(DataError, match=r"objective.kind: preference needs the column\(s\) \['rejected'\]"):
        split_samples(recipe_for(path))
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [TEXT_PAIR])
    with pytest.raises(DataError, match="They look like preference data: set objective.kind: dpo"):
        split_samples(recipe_for(pairs, objective="sft"))


def test_kto_reads_labelled_completions_and_refuses_labels_that_are_not_booleans(tmp_path):
    train, _, data_format = split_samples(recipe_for(write_jsonl(tmp_path / "u.jsonl", UNPAIRED), objective="kto"))
    assert data_format == "unpaired_preference" and sorted(train["label"]) == [False, True]
    bad = write_jsonl(tmp_path / "bad.jsonl", [UNPAIRED[0], {**UNPAIRED[1], "label": "no"}])
    with pytest.raises(DataError, match="bad.jsonl:2: 'label' must be true \\(desirable\\) or false"):
        split_samples(recipe_for(bad, objective="kto"))


@pytest.mark.parametrize("rows, objective", [([TEXT_PAIR, {**TEXT_PAIR, "prompt": "reverse\nxyz="}], "dpo"),
                                             ([CHAT_PAIR, CHAT_PAIR], "dpo"),
                                             ([IMPLICIT_PAIR, IMPLICIT_PAIR], "dpo"),
                                             (UNPAIRED, "kto")], ids=["text-pairs", "conversations", "implicit", "kto"])
def test_tokens_are_the_ones_trls_trainer_prepares(tmp_path, demo_model_path, tokenizer, rows, objective):
    """tuner's preview tokenises a row as DPOTrainer/KTOTrainer do: the same prompt and answer ids."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    config, trainer = (DPOConfig, DPOTrainer) if objective == "dpo" else (KTOConfig, KTOTrainer)
    model = AutoModelForCausalLM.from_pretrained(demo_model_path)
    args = config(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                  per_device_train_batch_size=2, max_length=64)
    prepared = trainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                       ref_model=AutoModelForCausalLM.from_pretrained(demo_model_path)).train_dataset
    layout = "preference" if objective == "dpo" else "unpaired_preference"
    answers = ("chosen_ids", "rejected_ids") if objective == "dpo" else ("completion_ids",)
    for row, trl_row in zip(rows, prepared):
        prompt_ids, completion_ids = encode_completions(row, layout, tokenizer)
        assert prompt_ids == trl_row["prompt_ids"]
        assert completion_ids == [trl_row[key] for key in answers]


def test_preview_shows_each_answer_after_its_masked_prompt(tmp_path, capsys):
    from tuner.cli import main

    path = write_jsonl(tmp_path / "pairs.jsonl", [CHAT_PAIR])
    assert main(["data", "preview", "demo-dpo", "--set", f"data.source={path}", "--set", "data.eval_fraction=0",
                 "--set", "training.eval_steps=null",
                 "--set", "model.id=builtin:demo", "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "format: preference (dpo: each answer after its masked prompt" in out
    assert "sample 1 (chosen): 16 tokens, 4 learned" in out and "sample 1 (rejected): 16 tokens, 4 learned" in out
    assert "«reverse\nabc=»cba</s>" in out and "«reverse\nabc=»cab</s>" in out


def test_reverse_pairs_prefer_the_reversal_to_a_near_miss_on_words_the_sft_task_never_shows():
    pairs = reverse_pairs(BUILTIN_DATASETS["builtin:reverse-pairs"])
    sft_words = {sample["input"] for sample in reverse_samples(BUILTIN_DATASETS["builtin:reverse"])}
    words = [pair["prompt"][0]["content"].split("\n")[1] for pair in pairs]
    assert len(set(words)) == len(pairs) and not set(words) & sft_words
    for word, pair in zip(words, pairs):
        chosen, rejected = pair["chosen"][0]["content"], pair["rejected"][0]["content"]
        assert chosen == word[::-1] and one_slip(chosen, rejected), (chosen, rejected)


def one_slip(answer: str, wrong: str) -> bool:
    """A letter dropped, one letter replaced, or two neighbours swapped."""
    if len(wrong) == len(answer) - 1:
        return any(answer[:i] + answer[i + 1:] == wrong for i in range(len(answer)))
    differ = [i for i, (a, b) in enumerate(zip(answer, wrong)) if a != b] if len(wrong) == len(answer) else []
    return len(differ) == 1 or (len(differ) == 2 and differ[1] == differ[0] + 1
                                and wrong[differ[0]] == answer[differ[1]] and wrong[differ[1]] == answer[differ[0]])
