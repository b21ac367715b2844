"""Long-context tactics and the settings that change activation memory: the chunked loss, activation offloading,
Liger's kernels, torch.compile, packing and 16-bit weights without autocast.  Each is planned (or the plan says it
is not) and the two tactics are recipe fields, rungs of the ladder and real code in the training entrypoint."""
from __future__ import annotations

import pytest

from tuner.catalog.models import model_facts
from tuner.planner import advise, plan
from tuner.planner.items import GIB
from tuner.recipe.io import validate_recipe
from tuner.recipe.registry import builtin_path
from tuner.recipe.source import RecipeError
from tuner.recipe.tactics import Rung

LLAMA_8B = "meta-llama/Llama-3.1-8B"
LONG = {"max_seq_length": 8192}


def recipe(model=LLAMA_8B, gpus=1, gpu="H200", method=None, data=None, dtype=None, **memory):
    return validate_recipe({"model": {"id": model, **({"dtype": dtype} if dtype else {})},
                            "hardware": {"gpus_per_machine": gpus, "gpu": gpu}, "method": method or {"kind": "lora"},
                            "memory": memory, "data": data or {}})


def item(memory_plan, words, device=0):
    return sum(i.bytes for i in memory_plan.devices[device].items if words in i.name)


# ---------------------------------------------------------------- the chunked loss

@pytest.mark.parametrize("kind", ["full", "lora"])
def test_chunked_loss_gives_the_transformers_loss_and_gradients(kind):
    """torch's chunked linear cross-entropy through the entrypoint's patch, against ForCausalLMLoss."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tuner.loading.chunked_loss import enable_chunked_loss

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000)
    reference = AutoModelForCausalLM.from_config(config)
    if kind == "lora":
        lora = LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
        reference = get_peft_model(reference, lora)
    chunked = copy.deepcopy(reference)
    enable_chunked_loss(chunked)
    ids = torch.randint(0, 1000, (2, 40))
    labels = ids.clone()
    labels[:, :7] = -100  # a prompt without loss
    for extra in ({}, {"num_items_in_batch": torch.tensor(50)}):  # the Trainer's token count under accumulation
        losses = []
        for model in (reference, chunked):
            model.zero_grad()
            loss = model(input_ids=ids, labels=labels, **extra).loss
            loss.backward()
            losses.append(loss.detach())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
        for a, b in zip(reference.parameters(), chunked.parameters()):
            if a.grad is not None:
                assert torch.allclose(a.grad, b.grad, atol=1e-6)
    assert chunked(input_ids=ids).logits.shape == (2, 40, 1000)  # inference keeps the full head


def test_chunked_loss_never_builds_the_logits():
    tokens, vocab = 8192, model_facts(LLAMA_8B).vocab_size
    plain, chunked = plan(recipe(**LONG)), plan(recipe(chunked_loss=True, **LONG))
    assert item(plain, "logits and cross-entropy") == tokens * vocab * 12  # 11.7 GiB
    assert item(chunked, "logits and cross-entropy") == 0 and item(chunked, "chunked loss") < 0.5 * GIB
    # and the allocator's cached segment of them (a third of the loss buffers)
    assert item(chunked, "cached fp32 logits") < 0.2 * GIB < 3.5 * GIB < item(plain, "cached fp32 logits")


@pytest.mark.parametrize("memory, field", [
    ({"distributed": "deepspeed", "zero_stage": 3}, "memory.chunked_loss"),
    ({"liger": True}, "memory.chunked_loss"),
])
def test_chunked_loss_refused_where_it_cannot_run(memory, field):
    with pytest.raises(RecipeError, match=f"{field}: "):
        validate_recipe({"model": {"id": LLAMA_8B}, "hardware": {"gpus_per_machine": 2, "gpu": "H200"},
                         "memory": {"distributed": "ddp", **memory, "chunked_loss": True}})
    with pytest.raises(RecipeError, match="cannot train lm_head"):
        recipe(chunked_loss=True, method={"kind": "lora", "lora": {"modules_to_save": ["lm_head"]}})


# ---------------------------------------------------------------- activation offloading

def test_activation_offloading_moves_the_checkpointed_inputs_to_pinned_host_ram():
    facts = model_facts(LLAMA_8B)
    inputs = facts.num_layers * 8192 * facts.hidden_size * 2
    on_gpu = plan(recipe(gradient_checkpointing=True, **LONG))
    offloaded = plan(recipe(gradient_checkpointing=True, activation_offloading=True, **LONG))
    assert item(on_gpu, "checkpointed layer inputs") == inputs
    assert item(offloaded, "checkpointed layer inputs") == 0
    assert item(offloaded, "checkpointed layer inputs", device=1) == inputs  # the host device, per machine
    assert item(offloaded, "copied back") == inputs / facts.num_layers
    loss = ("loss", ("allocated",))
    assert on_gpu.gpu.moment_gib(*loss) - offloaded.gpu.moment_gib(*loss) == pytest.approx(inputs / GIB)


def test_activation_offloading_reaches_the_trainer():
    from transformers import TrainingArguments

    from tuner.train.__main__ import checkpointing_arguments

    arguments = checkpointing_arguments(TrainingArguments, True, offload=True)
    assert arguments["activation_checkpointing_kwargs"] == {"use_reentrant": False, "offload": True}


@pytest.mark.parametrize("memory, hardware, message", [
    ({}, {"gpus_per_machine": 1, "gpu": "H200"}, "set gradient_checkpointing: true too"),
    ({"gradient_checkpointing": True}, {}, "on the CPU the activations already live in CPU RAM"),
])
def test_activation_offloading_refused_where_it_means_nothing(memory, hardware, message):
    with pytest.raises(RecipeError, match=message):
        validate_recipe({"hardware": hardware, "memory": {**memory, "activation_offloading": True}})


def test_the_advisor_climbs_the_new_rungs_for_long_context():
    """8B LoRA at 8k tokens on a 24 GB card needs the chunked loss; at 128k on an H200, offloading too."""
    (first, *_) = advise(recipe(gpu="RTX4090", **LONG))
    assert first.fits and first.changes == [Rung.CHUNKED_LOSS, Rung.GRADIENT_CHECKPOINTING]
    assert first.overrides == ["memory.gradient_checkpointing=true", "memory.chunked_loss=true"]
    (first, *_) = advise(recipe(max_seq_length=131072))
    assert first.fits and Rung.ACTIVATION_OFFLOADING in first.changes
    # on one GPU ZeRO-1/2 shard nothing: only ZeRO-3 (for its offload) is ever proposed
    assert all(a.recipe.memory.zero_stage in (None, 3) for a in advise(recipe(gpu="RTX4090", **LONG)))


# ---------------------------------------------------------------- Liger, torch.compile, packing

def test_liger_on_a_gpu_follows_its_published_kernels():
    facts = model_facts(LLAMA_8B)
    plain, liger = plan(recipe(**LONG)), plan(recipe(liger=True, **LONG))
    assert item(liger, "logits and cross-entropy") == 0
    rows = 256  # next_pow2(ceil(8192 / ceil(128256 / 4096)))
    assert item(liger, "Liger fused linear cross-entropy") == rows * facts.vocab_size * 2 + 8192 * (facts.hidden_size * 2 + 4)
    # per layer and token: RMSNorm keeps its input and an fp32 rstd (not the fp32 upcast); SwiGLU two of three
    saved = 8192 * facts.num_layers * (2 * (4 * facts.hidden_size - (2 * facts.hidden_size + 4))
                                       + 2 * facts.intermediate_size)
    assert item(plain, "saved activations") - item(liger, "saved activations") == saved
    assert any("liger" in note and "not measured" in note for note in liger.notes)


def test_liger_and_compile_are_said_when_not_modelled(tuner_home):
    from tuner.recipe.io import load_recipe

    cpu = plan(load_recipe(builtin_path("demo"), ["memory.liger=true", "memory.torch_compile=true"]))
    assert plan(load_recipe(builtin_path("demo"))).devices[0].total_gib == cpu.devices[0].total_gib
    assert any("Liger's Triton kernels need a GPU" in note for note in cpu.notes)
    assert any("torch_compile: not modelled" in note for note in cpu.notes)


def test_packing_makes_one_row_of_the_micro_batch():
    facts = model_facts(LLAMA_8B)
    padded = plan(recipe(attention="eager", micro_batch_size=4, max_seq_length=2048))
    packed = plan(recipe(attention="eager", micro_batch_size=4, max_seq_length=2048, data={"packing": True}))
    eager_scores = facts.num_layers * facts.num_heads * (4 + 2)  # fp32 softmax and its bf16 copy, per span^2
    grown = eager_scores * (8192**2 - 4 * 2048**2)
    assert item(packed, "saved activations") - item(padded, "saved activations") == grown
    assert any("one row of up to 8192 tokens" in note for note in packed.notes)
    flash = plan(recipe(attention="flash", micro_batch_size=4, max_seq_length=2048, data={"packing": True}))
    assert not any("packing" in note for note in flash.notes)


# ---------------------------------------------------------------- 16-bit weights without autocast

def test_bf16_weights_without_autocast_keep_the_lora_branch_in_fp32():
    no_autocast = plan(recipe(dtype="bfloat16", mixed_precision="no", **LONG))
    assert any("PEFT keeps the adapters in fp32" in note for note in no_autocast.notes)
    facts = model_facts(LLAMA_8B)
    assert item(no_autocast, "LoRA adapter weights") == facts.lora_params(16, "all-linear") * 4
    with_autocast = plan(recipe(dtype="bfloat16", mixed_precision="bf16", **LONG))
    assert not any("PEFT keeps the adapters in fp32" in note for note in with_autocast.notes)
