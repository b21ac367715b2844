"""Data for training: formats, exact loss masks, chat templates, checks with line numbers, packing, preview.

No training here: the demo tokenizer and model are loaded in-process (about a second each).
"""
from __future__ import annotations

import copy
import json

import pytest

from tuner.data.formats import DEFAULT_CHAT_TEMPLATE, IGNORE_INDEX, chat_segments
from tuner.data.prepare import data_collator, encode_batch, split_samples
from tuner.data.prepared import prepare_data
from tuner.data.preview import labelled_segments, preview_examples
from tuner.data.sources import DataError
from tuner.recipe.io import validate_recipe

M = IGNORE_INDEX


@pytest.fixture(scope="module")
def tokenizer(demo_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model_path)


@pytest.fixture
def no_template(tokenizer):
    """The demo tokenizer without its chat template: the documented defaults apply."""
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    return plain


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def expected(tokenizer, *pieces: tuple[str, bool]) -> tuple[list[int], list[int]]:
    """input_ids and labels written out piece by piece: (text, learned)."""
    input_ids, labels = [], []
    for text, learned in pieces:
        piece = ids(tokenizer, text)
        input_ids += piece
        labels += piece if learned else [M] * len(piece)
    return input_ids, labels


def recipe_for(path, **data) -> object:
    return validate_recipe({
        "model": {"id": "builtin:demo", "dtype": "float32"},
        "memory": {"mixed_precision": "no", "max_seq_length": data.pop("max_seq_length", 64)},
        "data": {"source": str(path), "eval_fraction": 0, **data},
    })


def write_jsonl(path, rows) -> object:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def encode(tokenizer, sample, data_format, tmp_path, **data):
    """One sample as the batched ``map`` encodes it."""
    recipe = recipe_for(tmp_path / "unused.jsonl", **data)
    encoded = encode_batch({key: [value] for key, value in sample.items()}, data_format, tokenizer, recipe)
    return {key: values[0] for key, values in encoded.items()}


def test_demo_tokenizer_is_character_level(tokenizer):
    """The exact arrays below rely on one id per character and </s> as one special token."""
    assert ids(tokenizer, "ab</s>") == [tokenizer.convert_tokens_to_ids("a"), tokenizer.convert_tokens_to_ids("b"),
                                        tokenizer.eos_token_id]


def test_text_format_learns_every_token(tokenizer, tmp_path):
    out = encode(tokenizer, {"text": "abc"}, "text", tmp_path)
    a, b, c = (tokenizer.convert_tokens_to_ids(ch) for ch in "abc")
    assert out["input_ids"] == [a, b, c, tokenizer.eos_token_id]
    assert out["labels"] == [a, b, c, tokenizer.eos_token_id]
    assert out["truncated"] is False


def test_instruction_with_chat_template_masks_the_prompt(tokenizer, tmp_path):
    sample = {"instruction": "reverse", "input": "abc", "output": "cba"}
    out = encode(tokenizer, sample, "instruction", tmp_path)
    assert (out["input_ids"], out["labels"]) == expected(tokenizer, ("reverse\nabc=", False), ("cba</s>", True))


def test_instruction_without_template_uses_alpaca(no_template, tmp_path):
    with_input = encode(no_template, {"instruction": "reverse", "input": "abc", "output": "cba"}, "instruction", tmp_path)
    assert (with_input["input_ids"], with_input["labels"]) == expected(
        no_template, ("### Instruction:\nreverse\n\n### Input:\nabc\n\n### Response:\n", False), ("cba</s>", True))
    without = encode(no_template, {"instruction": "say hi", "input": "", "output": "hi"}, "instruction", tmp_path)
    assert (without["input_ids"], without["labels"]) == expected(
        no_template, ("### Instruction:\nsay hi\n\n### Response:\n", False), ("hi</s>", True))


def test_train_on_prompt_learns_everything(tokenizer, tmp_path):
    out = encode(tokenizer, {"instruction": "reverse", "input": "ab", "output": "ba"}, "instruction", tmp_path,
                 train_on_prompt=True)
    assert out["labels"] == out["input_ids"] == ids(tokenizer, "reverse\nab=ba</s>")


CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo"},
    {"role": "user", "content": "bye"},
    {"role": "assistant", "content": "ok"},
]


def test_default_chat_template_renders_roles_and_masks_all_but_assistant_turns(no_template, tmp_path):
    rendered = no_template.apply_chat_template(CONVERSATION, tokenize=False, chat_template=DEFAULT_CHAT_TEMPLATE)
    assert rendered == ("<|system|>\nbe brief</s>\n<|user|>\nhi</s>\n<|assistant|>\nyo</s>\n"
                        "<|user|>\nbye</s>\n<|assistant|>\nok</s>\n")
    assert chat_segments(CONVERSATION, no_template) == [
        ("<|system|>\nbe brief</s>\n<|user|>\nhi</s>\n<|assistant|>\n", False), ("yo</s>\n", True),
        ("<|user|>\nbye</s>\n<|assistant|>\n", False), ("ok</s>\n", True),
    ]
    out = encode(no_template, {"messages": CONVERSATION}, "chat", tmp_path, max_seq_length=256)
    assert (out["input_ids"], out["labels"]) == expected(
        no_template,
        ("<|system|>\nbe brief</s>\n<|user|>\nhi</s>\n<|assistant|>\n", False), ("yo</s>\n", True),
        ("<|user|>\nbye</s>\n<|assistant|>\n", False), ("ok</s>\n", True),
    )


def test_chat_uses_the_tokenizers_own_template(tokenizer, tmp_path):
    out = encode(tokenizer, {"messages": CONVERSATION[1:3]}, "chat", tmp_path)
    assert (out["input_ids"], out["labels"]) == expected(tokenizer, ("hi=", False), ("yo</s>", True))


def test_truncation_is_flagged_and_cut(tokenizer, tmp_path):
    out = encode(tokenizer, {"text": "abcdefghijkl"}, "text", tmp_path, max_seq_length=8)
    assert out["truncated"] is True and len(out["input_ids"]) == len(out["labels"]) == 8


def test_auto_detection_and_override(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"sample {i}", "instruction": "x", "output": "y"} for i in range(4)])
    assert split_samples(recipe_for(path))[2] == "instruction"  # instruction columns win over text
    assert split_samples(recipe_for(path, format="text"))[2] == "text"
    with pytest.raises(DataError, match=r"data.format: chat needs the column\(s\) \['messages'\]"):
        split_samples(recipe_for(path, format="chat"))


def test_malformed_jsonl_lines_are_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": broken}\n[1, 2]\n{"text": "fine"}\n')
    with pytest.raises(DataError) as error:
        split_samples(recipe_for(path))
    message = str(error.value)
    assert message.startswith(f"data.source: {path}:3: not valid JSON (Expecting value); 1 more of 4 rows cannot be used")
    assert "line 4 (a JSON list, not an object)" in message


def test_rows_missing_values_are_named_by_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"instruction": "a", "output": "b"}\n\n{"instruction": "a", "output": ""}\n'
                    '{"instruction": "a"}\n')
    with pytest.raises(DataError, match=r"rows.jsonl:3: 'output' is missing or empty; 1 more of 3 rows cannot be used: "
                                        r"line 4 \('output' is missing or empty\)\. .*read as instruction"):
        split_samples(recipe_for(path, format="instruction"))


def test_empty_data_and_unknown_layout(tmp_path):
    with pytest.raises(DataError, match="holds no samples"):
        split_samples(recipe_for(write_jsonl(tmp_path / "empty.jsonl", [])))
    with pytest.raises(DataError, match="cannot tell the data format from columns"):
        split_samples(recipe_for(write_jsonl(tmp_path / "odd.jsonl", [{"question": "q"}])))


def test_all_samples_too_long_is_refused_before_training(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "long.jsonl", [{"text": "x" * 40} for _ in range(3)])
    with pytest.raises(DataError, match="all 3 training samples are longer than 16 tokens"):
        prepare_data(recipe_for(path, max_seq_length=16), tokenizer)


def test_samples_with_nothing_to_learn_are_dropped_with_a_count(tmp_path, tokenizer):
    rows = [{"instruction": "reverse", "input": "ab", "output": "ba"},
            {"instruction": "r" * 30, "input": "", "output": "long prompt, answer cut off"}]
    data = prepare_data(recipe_for(write_jsonl(tmp_path / "d.jsonl", rows), max_seq_length=20), tokenizer)
    assert (len(data.train), data.truncated, data.dropped) == (1, 1, 1)


def test_a_second_preparation_reuses_the_prepared_dataset(tmp_path, tokenizer, caplog):
    """A re-run or a resume on the same data file, recipe fields and tokenizer reuses the tokenised dataset
    ($TUNER_HOME/prepared/<fingerprint>) and trains on the same tokens; a change to either prepares again."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "reverse", "input": f"w{i}x", "output": f"x{i}w"}
                                              for i in range(40)] + [{"instruction": "r" * 30, "output": "cut"}] * 5)
    recipe = recipe_for(path, eval_fraction=0.2, max_seq_length=20)
    reused = "reusing the prepared dataset"
    with caplog.at_level("INFO", logger="tuner"):
        first = prepare_data(recipe, tokenizer)
        assert reused not in caplog.text
        again = prepare_data(recipe, tokenizer)
        assert reused in caplog.text
        for split in ("train", "eval"):
            for column in ("input_ids", "labels"):
                assert getattr(again, split)[column] == getattr(first, split)[column]
        assert first.truncated and first.dropped  # the long rows: their counts are kept too
        assert (again.data_format, again.truncated, again.dropped) == (first.data_format, first.truncated, first.dropped)
        assert again.raw_eval["input"] == first.raw_eval["input"]

        caplog.clear()
        prepare_data(recipe_for(path, eval_fraction=0.2, max_seq_length=24), tokenizer)  # shapes the tokens
        assert reused not in caplog.text
        write_jsonl(path, [{"instruction": "reverse", "input": "ab", "output": "ba"}] * 5)  # the file changed
        changed = prepare_data(recipe, tokenizer)
        assert reused not in caplog.text and len(changed.train) == 4


def test_tokenising_processes_give_the_same_tokens_and_share_the_prepared_dataset(tmp_path, tokenizer, monkeypatch):
    """data.num_proc: 2 tokenises in two processes (a real datasets map) into the same tokens, flags and drops as one
    process, and the prepared dataset is keyed without it; unset, small data stays in one process and large data
    gets the cores this rank may use (shared with the machine's other ranks)."""
    import os

    from tuner.data.prepare import SAMPLES_PER_PROCESS, tokenise, tokenising_processes
    from tuner.data.prepared import data_fingerprint

    rows = [{"instruction": "reverse", "input": f"w{i}x" * (i % 7), "output": f"x{i}w"} for i in range(300)]
    path = write_jsonl(tmp_path / "d.jsonl", rows + [{"instruction": "r" * 30, "output": "cut"}] * 5)
    one, two = (recipe_for(path, max_seq_length=24, num_proc=n) for n in (1, 2))
    raw, _, data_format = split_samples(one)
    alone, split = (tokenise(raw, recipe, tokenizer, data_format, "training") for recipe in (one, two))
    assert (len(alone[0].cache_files), len(split[0].cache_files)) == (1, 2)  # one shard per process
    assert split[1:] == alone[1:] and alone[1] and alone[2]  # truncated and dropped, counted across processes
    for column in ("input_ids", "labels"):
        assert split[0][column] == alone[0][column]
    assert data_fingerprint(one, tokenizer) == data_fingerprint(two, tokenizer)

    unset = recipe_for(path)
    cores = len(os.sched_getaffinity(0))
    assert tokenising_processes(unset, SAMPLES_PER_PROCESS * 64) == (cores if cores > 1 else None)
    assert tokenising_processes(unset, SAMPLES_PER_PROCESS + 1) is None  # one process's worth of samples
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores))  # one rank per core: each tokenises alone
    assert tokenising_processes(unset, SAMPLES_PER_PROCESS * 64) is None


def test_a_file_whose_rows_passed_is_not_scanned_again_until_it_changes(tmp_path, tokenizer, caplog):
    """``tuner run`` checks every row before launch (check_data); the ranks (prepare_data), a re-run, a resume and
    preview then load the same file without scanning it again.  A file that changed, or one read another way, is
    checked again."""
    from tuner.data.prepare import check_data

    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"s{i}"} for i in range(30)])
    recipe = recipe_for(path)
    skipped = "passed the checks before"
    with caplog.at_level("INFO", logger="tuner"):
        assert check_data(recipe).train == 30
        assert skipped not in caplog.text
        assert len(prepare_data(recipe, tokenizer).train) == 30  # what each rank does after `tuner run`
        assert skipped in caplog.text
        caplog.clear()
        assert check_data(recipe).train == 30
        assert skipped in caplog.text
        caplog.clear()
        with pytest.raises(DataError, match=r"instruction needs the column"):  # read as another layout: checked
            check_data(recipe_for(path, format="instruction"))
        with path.open("a") as stream:
            stream.write('{"text": "fine"}\n{"text": 7}\n{broken\n')
        with pytest.raises(DataError, match=r"d\.jsonl:33: not valid JSON"):
            check_data(recipe)
        assert skipped not in caplog.text


def test_preview_shows_the_prepared_samples_without_reading_the_file_again(tmp_path, tokenizer, caplog):
    """Once a run prepared the data, preview shows the first samples of the prepared dataset (the tokens the
    Trainer takes, with their truncation flags) instead of loading and encoding the file: the same examples."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "word " * (i % 9 + 1)} for i in range(40)])
    recipe = recipe_for(path, max_seq_length=16)
    encoded_here = preview_examples(recipe, tokenizer, 6)
    assert any(example.truncated for example in encoded_here[1]) and not all(e.truncated for e in encoded_here[1])
    prepared = prepare_data(recipe, tokenizer)
    with caplog.at_level("INFO", logger="tuner"):
        caplog.clear()
        from_cache = preview_examples(recipe, tokenizer, 6)
        assert "data:" not in caplog.text  # neither loaded nor checked: the prepared dataset answered
    assert from_cache == encoded_here
    assert [example.tokens for example in from_cache[1]] == [len(ids) for ids in prepared.train[:6]["input_ids"]]
    assert prepared.train.column_names == ["input_ids", "labels"]  # the flags stay out of the Trainer's batches


def test_split_is_deterministic_with_the_seed(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"s{i}"} for i in range(50)])
    first = split_samples(recipe_for(path, eval_fraction=0.2))
    again = split_samples(recipe_for(path, eval_fraction=0.2))
    assert first[0]["text"] == again[0]["text"] and first[1]["text"] == again[1]["text"]
    assert len(first[1]) == 10 and not set(first[0]["text"]) & set(first[1]["text"])
    other = validate_recipe({**recipe_for(path, eval_fraction=0.2).model_dump(), "training": {"seed": 7}})
    assert split_samples(other)[0]["text"] != first[0]["text"]


def test_packing_keeps_attention_within_each_sample(tmp_path, tokenizer, demo_model_path):
    """One flattened row gives each sample the same logits as the padded batch does."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model_path, attn_implementation="sdpa")
    model.config.use_cache = False  # as the entrypoint sets it for training
    features = [{"input_ids": ids(tokenizer, t), "labels": ids(tokenizer, t)} for t in ("hello world", "abc")]
    packed = data_collator(recipe_for(tmp_path / "x.jsonl", packing=True), tokenizer)(copy.deepcopy(features))
    padded = data_collator(recipe_for(tmp_path / "x.jsonl"), tokenizer)(copy.deepcopy(features))
    assert packed["input_ids"].shape == (1, 14) and "attention_mask" not in packed
    assert packed["position_ids"].tolist() == [list(range(11)) + list(range(3))]
    assert packed["labels"][0, 11].item() == M  # the first token of each sample learns nothing from the one before
    with torch.no_grad():
        flat = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits[0]
        batch = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
    torch.testing.assert_close(flat[:11], batch[0, :11], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flat[11:], batch[1, :3], atol=1e-5, rtol=1e-5)


def test_labelled_segments_and_preview(tmp_path, tokenizer, capsys):
    input_ids, labels = expected(tokenizer, ("reverse\nab=", False), ("ba</s>", True))
    assert labelled_segments(input_ids, labels, tokenizer) == [("reverse\nab=", False), ("ba</s>", True)]

    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "reverse", "input": "xyz", "output": "zyx"}])
    data_format, examples = preview_examples(recipe_for(path), tokenizer, count=5)
    assert data_format == "instruction" and len(examples) == 1
    assert examples[0].segments == [("reverse\nxyz=", False), ("zyx</s>", True)]
    assert (examples[0].tokens, examples[0].trainable_tokens) == (16, 4)

    from tuner.cli import main

    assert main(["data", "preview", "demo", "-n", "2", "--set", "data.max_samples=10"]) == 0
    out = capsys.readouterr().out
    assert "format: instruction (loss on completions only; masked text between « »)" in out
    assert out.count("«reverse\n") == 2 and "</s>" in out


def test_uncached_hub_dataset_offline_is_a_clear_error(monkeypatch):
    """Offline as the libraries see it: they read HF_HUB_OFFLINE once, when first imported."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match="Offline, only datasets already in the local cache load"):
        split_samples(recipe_for("someorg/not-cached-dataset"))
