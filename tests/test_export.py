"""tuner export: a run as a GGUF file that an independent reader, transformers' own GGUF loader, rebuilds into the
same tokenizer ids and the same logits (f16/bf16 tight, q8_0 within its stated tolerance); a LoRA run merged
first; every architecture tuner lays out; an Ollama Modelfile whose template prompts as the chat template does;
and refusals (architecture, destination) before anything is written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import library_noise
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tuner.cli import main
from tuner.export.check import LOGIT_TOLERANCE, read_back
from tuner.recipe.io import load_recipe, recipe_to_yaml
from tuner.recipe.registry import builtin_path
from tuner.rundir.layout import FINAL_DIR, LOCK_FILE, MANIFEST

PROMPTS = ["reverse\nkayak=", "reverse\nstone=", "reverse\nhello world="]


def logits_and_ids(model, tokenizer, prompt: str):
    ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float(), ids


def assert_reads_back(path: Path, model, tokenizer, tolerance: float) -> float:
    """transformers' GGUF reader gives the same ids, and logits within ``tolerance`` of the largest |logit|; returns
    that relative difference."""
    gguf_model, gguf_tokenizer = read_back(path)
    largest = scale = 0.0
    for prompt in PROMPTS:
        expected, ids = logits_and_ids(model.eval(), tokenizer, prompt)
        got, gguf_ids = logits_and_ids(gguf_model, gguf_tokenizer, prompt)
        assert gguf_ids == ids, prompt
        largest = max(largest, (expected - got).abs().max().item())
        scale = max(scale, expected.abs().max().item())
        assert expected[0, -1].argmax() == got[0, -1].argmax()
    assert largest / scale <= tolerance, (largest, scale)
    print(f"{path.name}: largest logit difference {largest:.3g} of {scale:.3g} ({largest / scale:.2g})")
    return largest / scale


@pytest.mark.slow
@pytest.mark.xdist_group("trained-demo")
@pytest.mark.parametrize("quant", ["f16", "bf16", "q8_0"])
def test_trained_demo_exports_a_gguf_that_transformers_reads_back_the_same(trained_demo, tmp_path, capfd, quant):
    out = tmp_path / quant
    assert main(["export", str(trained_demo), "--quant", quant, "-o", str(out), "--check"]) == 0
    printed, said = capfd.readouterr()
    assert not library_noise(printed + said), said  # the loading bars: in the run's log
    assert "transformers' GGUF reader: passed" in printed and "(held-out samples)" in printed
    path = out / f"demo-{quant}.gguf"
    recorded = json.loads((out / MANIFEST).read_text())["files"]
    assert list(recorded) == [path.name] and recorded[path.name]["size"] == path.stat().st_size
    model = AutoModelForCausalLM.from_pretrained(trained_demo / FINAL_DIR, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(trained_demo / FINAL_DIR)
    assert_reads_back(path, model, tokenizer, LOGIT_TOLERANCE[quant])
    assert read_back(path)[1].chat_template == tokenizer.chat_template


def lora_run(tmp_path: Path, base: Path) -> Path:
    """A LoRA run directory whose adapter changes the model (random B, untrained): what final/ holds after training."""
    from peft import LoraConfig, get_peft_model

    recipe = load_recipe(builtin_path("demo-lora"), [f"output.dir={tmp_path / 'runs' / 'lora'}"])
    run = tmp_path / "runs" / "lora"
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(
        r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    model.save_pretrained(run / FINAL_DIR)
    AutoTokenizer.from_pretrained(base).save_pretrained(run / FINAL_DIR)
    for folder in (run, run / FINAL_DIR):
        (folder / LOCK_FILE).write_text(recipe_to_yaml(recipe))
    return run


def test_lora_run_is_merged_into_its_base_then_exported(tmp_path, demo_model_path):
    from peft import PeftModel

    run = lora_run(tmp_path, demo_model_path)
    assert main(["export", str(run), "--quant", "f16"]) == 0
    path = run / "export" / "f16" / "demo-lora-f16.gguf"
    base = AutoModelForCausalLM.from_pretrained(demo_model_path)
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(demo_model_path),
                                       str(run / FINAL_DIR)).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(demo_model_path)
    assert_reads_back(path, merged, tokenizer, LOGIT_TOLERANCE["f16"])
    gguf_logits, _ = logits_and_ids(read_back(path)[0], tokenizer, PROMPTS[0])
    base_logits, _ = logits_and_ids(base.eval(), tokenizer, PROMPTS[0])
    assert (gguf_logits - base_logits).abs().max() > 0.1, "the adapter must be in the file"


TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128)


@pytest.mark.parametrize("model_type, extra", [
    ("mistral", {}),
    ("qwen2", {}),
    ("qwen3", {"head_dim": 128}),  # transformers' reader takes Qwen3's head_dim as its default, 128
    ("gemma2", {"head_dim": 256}),  # as Gemma 2 9B: the reader (and llama.cpp) take the attention scale from it
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64}}),
])
def test_every_architecture_tuner_lays_out_reads_back_the_same(tmp_path, demo_model_path, model_type, extra):
    """A tiny random model of each architecture, written and read back (the demo's tokenizer stands in for theirs)."""
    import gguf
    from transformers import AutoConfig

    from tuner.export.gguf_file import write_gguf

    tokenizer = AutoTokenizer.from_pretrained(demo_model_path)
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), **TINY, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # Gemma's norms start at zero (scale 1 + w): give them something to carry
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    path = tmp_path / f"{model_type}.gguf"
    write_gguf(model, tokenizer, path, "f16", f"tiny-{model_type}")  # a file named just "mistral" sends
    # transformers 5.24's reader to a "mistral" GGUF layout gguf-py does not have (llama.cpp writes Mistral as llama)
    if model_type == "llama":  # transformers' reader does not apply rope_freqs: check the factors llama.cpp reads
        factors = next(t for t in gguf.GGUFReader(path).tensors if t.name == "rope_freqs.weight").data
        assert factors.min() == 1.0 and factors.max() == pytest.approx(8.0)
        return
    assert_reads_back(path, model, tokenizer, LOGIT_TOLERANCE["f16"])


def test_a_byte_level_bpe_tokenizer_round_trips_its_ids(tmp_path):
    """A Qwen2-style byte-level BPE (trained here on a few sentences) comes back with the same ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from tuner.export.gguf_file import _Writer
    from tuner.export.vocab import gguf_vocab, write_vocab

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    text = ["The quick brown fox jumps over the lazy dog.", "Reverse these words: stone, kayak, 1234!"] * 20
    backend.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")
    vocab = gguf_vocab(tokenizer, len(tokenizer) + 3)
    assert vocab.pre == "qwen2" and vocab.merges and vocab.tokens[-1] == f"[PAD{len(tokenizer) + 2}]"
    writer = _Writer(tmp_path / "tok.gguf", "qwen2")
    write_vocab(writer, vocab, tokenizer)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    read = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=str(tmp_path / "tok.gguf"))
    for sample in ["The lazy fox reverses 1234 stones.", "kayak<|endoftext|>  spaced\nlines"]:
        assert read(sample)["input_ids"] == tokenizer(sample)["input_ids"], sample


def test_ollama_modelfile_prompts_as_the_run_was_trained(tmp_path, demo_model_path, capsys):
    from tuner.export.modelfile import template_pieces

    run = lora_run(tmp_path, demo_model_path)
    assert main(["export", str(run), "--format", "ollama", "--quant", "q8_0"]) == 0
    out = capsys.readouterr().out
    folder = run / "export" / "q8_0"
    assert f"ollama create demo-lora -f {folder / 'Modelfile'}" in out
    modelfile = (folder / "Modelfile").read_text()
    assert "FROM ./demo-lora-q8_0.gguf" in modelfile and 'PARAMETER stop "</s>"' in modelfile
    assert "PARAMETER temperature 0" in modelfile  # the demo recipes answer greedily
    # the template's user turn carries the run's shared instruction, as `tuner chat` sends a message
    assert 'eq .Role "user" }}reverse\n{{ .Content }}={{' in modelfile
    tokenizer = AutoTokenizer.from_pretrained(demo_model_path)
    render = lambda messages, generation: tokenizer.apply_chat_template(  # noqa: E731
        messages, tokenize=False, add_generation_prompt=generation)
    pieces = template_pieces(render)
    conversation = [{"role": "user", "content": "reverse\nabc"}, {"role": "assistant", "content": "cba"},
                    {"role": "user", "content": "reverse\nxyz"}]
    assert pieces.render(conversation) == render(conversation, True) == "reverse\nabc=cba</s>reverse\nxyz="


def test_a_template_with_logic_per_turn_is_refused():
    from jinja2 import Template

    from tuner.export import ExportRefused
    from tuner.export.modelfile import template_pieces

    numbered = Template("{% for m in messages %}{{ loop.index }}: {{ m['content'] }};{% endfor %}")
    with pytest.raises(ExportRefused, match="first user turn"):
        template_pieces(lambda messages, generation: numbered.render(messages=messages))


def test_unsupported_architecture_is_refused_naming_it_before_anything_is_written(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    from tuner.render.run_directory import write_run_directory

    model_dir = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).save_pretrained(model_dir)
    recipe = load_recipe(builtin_path("demo"), [f"model.id={model_dir}"])
    run = write_run_directory(recipe, tmp_path / "runs" / "gpt2")
    GPT2LMHeadModel.from_pretrained(model_dir).save_pretrained(run / FINAL_DIR)
    assert main(["export", str(run)]) == 2
    err = capsys.readouterr().err
    assert "GPT2LMHeadModel (model_type 'gpt2') is not exported to GGUF" in err and "Traceback" not in err
    assert not (run / "export").exists()


def test_an_export_never_replaces_files_tuner_did_not_write(tmp_path, demo_model_path, capsys):
    run = lora_run(tmp_path, demo_model_path)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.md").write_text("mine")
    assert main(["export", str(run), "-o", str(precious), "--force"]) == 2
    assert "holds files tuner did not write (notes.md)" in capsys.readouterr().err
    assert sorted(p.name for p in precious.iterdir()) == ["notes.md"]
    assert main(["export", str(run), "-o", str(run / FINAL_DIR)]) == 2  # the run's own model
    assert main(["export", str(run)]) == 0
    assert main(["export", str(run)]) == 2 and "--force" in capsys.readouterr().err
    assert main(["export", str(run), "--force"]) == 0
