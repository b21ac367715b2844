"""Cross-field rules about the model: its config can be read, its classes load, its own code is trusted."""
from __future__ import annotations

from tuner.catalog.models import custom_code
from tuner.recipe.problem import Problem
from tuner.recipe.schema import Recipe


def _known_facts(recipe: Recipe):
    """The model's facts (catalog, local files, hub cache), or None when tuner has none or the model ships its own
    code (whose classes transformers' table does not describe)."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    if custom_code(recipe.model.id, recipe.model.revision):
        return None
    try:
        return model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code)
    except UnknownModelError:
        return None  # the plan says the model is unknown; the loader meets transformers' own checks


def _loads(recipe: Recipe) -> list[Problem]:
    """What transformers and PEFT refuse when this model loads or is wrapped, refused first, in their words: a
    reward model of a type transformers has no body to put a score head on, an attention implementation the model
    class does not support (transformers' ``_supports_sdpa`` / ``_supports_flash_attn``, from
    :mod:`tuner.catalog.model_classes`), and for qlora a ``modules_to_save`` layer
    bitsandbytes quantises (its copy cannot train).  LoRA dropout on fused experts, which PEFT refuses, is
    :func:`_lora_targets`' check."""
    facts = _known_facts(recipe)
    if facts is None:
        return []
    from tuner.catalog.model_classes import model_class, no_score_head_reason, score_head_class

    problems = []
    if recipe.objective.kind == "reward" and score_head_class(facts.model_type) is None:
        problems.append(Problem(
            "objective.kind", f"{no_score_head_reason(facts.model_type)} ({recipe.model.id}), and TRL's "
            "RewardTrainer trains that head. Choose a model of another type (llama, qwen3, qwen3_moe, llama4_text, "
            "glm4_moe, ...), or another objective.", anchor="objective.kind"))
    attention, cls = recipe.memory.attention, model_class(facts.model_type)
    if cls is not None and not cls.supports(attention):
        fallback = "sdpa" if attention == "flash" and cls.sdpa else "eager"
        problems.append(Problem(
            "memory.attention", f"transformers {cls.transformers_version} refuses attention {attention} for "
            f"{cls.name} ({recipe.model.id}): \"{cls.refusals.get(attention, '')}\" Set attention: {fallback}, or "
            f"auto (flash-attention where flash-attn is installed and {cls.name} supports it, else "
            f"{'sdpa' if cls.sdpa else 'eager'})."))
    if recipe.memory.chunked_loss and facts.final_logit_softcapping:
        problems.append(Problem(
            "memory.chunked_loss", f"{recipe.model.id} soft-caps its logits (final_logit_softcapping "
            f"{facts.final_logit_softcapping:g}), which the chunked loss cannot do: set chunked_loss: false."))
    missing = [part for part in recipe.method.train if part != "language_model" and not facts.inventory.parts]
    if missing:
        problems.append(Problem(
            "method.train", f"{recipe.model.id} is a causal LM ({facts.inventory.architecture}): it has no "
            f"{' or '.join(missing)}; set train: [language_model], or choose an image-text model."))
    lora = recipe.method.lora
    if recipe.method.kind == "qlora" and lora.modules_to_save:
        # bitsandbytes quantises the decoder layers' nn.Linear maps (lm_head and embeddings stay in model.dtype)
        quantised = sorted({lin.name.split(".")[-1] for kind in facts.layer_kinds for lin in kind.linears
                            if lin.quantized and any(lin.name == name or lin.name.endswith("." + name)
                                                     or lin.name.split(".")[-1] == name
                                                     for name in lora.modules_to_save)})
        if quantised:
            bits = recipe.method.quantization.bits if recipe.method.quantization else 4
            problems.append(Problem(
                "method.lora.modules_to_save", f"bitsandbytes quantises {', '.join(quantised)} of {recipe.model.id} "
                f"to {bits}-bit, and PEFT's trained copy of a quantised layer cannot take gradients: \"only Tensors "
                "of floating point dtype can require gradients\" Adapt it with target_modules instead, keep "
                "modules_to_save to unquantised modules (lm_head, embed_tokens, norms), or set method.kind: lora."))
    return problems


def remote_code_problem(model_id: str, revision: str | None, trust_remote_code: bool) -> str | None:
    """Why a model cannot be loaded as the recipe stands: it ships code (config.json's auto_map) the recipe does not
    allow to run.  Read from a local folder or the Hugging Face cache, before anything runs it."""
    classes = custom_code(model_id, revision)
    if not classes or trust_remote_code:
        return None
    return (f"{model_id} ships its own Python code ({', '.join(classes)}), which runs on every rank when the model "
            "loads; set model.trust_remote_code: true if you trust its author (and pin model.revision to a commit "
            "you reviewed), or use a model without custom code.")


def _model(recipe: Recipe) -> list[Problem]:
    model = recipe.model
    problem = remote_code_problem(model.id, model.revision, model.trust_remote_code)
    problems = [Problem("model.trust_remote_code", problem, anchor="model.id")] if problem else []
    damaged = model_config_problem(model.id)
    return problems + ([Problem("model.id", damaged)] if damaged else [])


def model_config_problem(model_id: str) -> str | None:
    """What is wrong with a local model folder's config.json (not a mapping, impossible sizes, too deep), named
    with the file and the key; None when it is sound or model.id is not a local folder."""
    from pathlib import Path

    from tuner.catalog.model_config import ModelConfigError, read_config

    try:
        config_file = Path(model_id).expanduser() / "config.json"
        if not config_file.is_file():
            return None
    except (OSError, RuntimeError, ValueError):  # a name the filesystem cannot hold: not a folder
        return None
    try:
        read_config(config_file)
    except ModelConfigError as exc:
        return str(exc)
    return None
