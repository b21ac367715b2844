"""``tuner export``: a run (or a model folder) to ``export/<quant>/`` holding its GGUF file and, for Ollama, a
Modelfile.  Checked before anything is written: the destination is tuner's to write (as merge checks its
own), the architecture is one gguf-py lays out, the chat template translates.  The folder is filled in a hidden
sibling, read back with transformers' GGUF reader when asked (``--check``), and only then swapped into place
with its manifest (``tuner_files.json``: each file tuner put there, its size and SHA-256) written last.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from tuner.export import ExportRefused
from tuner.infer.target import InferenceTarget
from tuner.rundir.layout import CHECKPOINTS_DIR, EXPORT_DIR, FINAL_DIR

MODELFILE = "Modelfile"
CHECK_PROMPTS = 8


@dataclass
class ExportResult:
    folder: Path
    gguf_line: str
    gguf_path: Path
    modelfile: Path | None = None
    ollama_create: str | None = None
    check_line: str | None = None
    notes: tuple[str, ...] = ()


def default_output(target: InferenceTarget, quant: str) -> Path:
    if target.run_dir is None:
        raise ExportRefused("give -o DIR: the model is not a tuner run directory, so there is no export/ folder "
                            "beside it.")
    return target.run_dir / EXPORT_DIR / quant


def check_output(output: Path, target: InferenceTarget, force: bool) -> None:
    """Refuse, before the model is loaded, a destination that is not tuner's to write (see merge's own check)."""
    from tuner.fileio import DestinationRefused, check_destination
    from tuner.rundir.manifest import check_owned

    inside = []
    if target.run_dir is not None:
        inside = [(target.run_dir / FINAL_DIR, f"the run's final model {target.run_dir / FINAL_DIR}"),
                  (target.run_dir / CHECKPOINTS_DIR, f"the run's checkpoints {target.run_dir / CHECKPOINTS_DIR}")]
    holding = [(target.run_dir, f"the run {target.run_dir}")] if target.run_dir else []
    try:
        check_destination(output, holding=holding, inside=inside)
        check_owned(output)
    except DestinationRefused as exc:
        raise ExportRefused(str(exc)) from None
    if output.is_dir() and any(output.iterdir()) and not force:
        raise ExportRefused(f"{output}: already exists; pass --force to replace it, or choose another -o.")


def check_architecture(target: InferenceTarget) -> None:
    """The architecture refused from the model's config.json alone, before any weight is read."""
    from transformers import AutoConfig

    from tuner.catalog.model_classes import IMAGE_TEXT, auto_class_for
    from tuner.export.gguf_file import layout_for

    config = AutoConfig.from_pretrained(target.model_path, revision=target.recipe.model.revision,
                                        trust_remote_code=target.recipe.model.trust_remote_code)
    if auto_class_for(config.to_dict()) == IMAGE_TEXT:
        raise ExportRefused(
            f"{target.model_path}: an image-text model ({type(config).__name__}): llama.cpp reads its vision tower "
            "and projector from a separate projector file (mmproj GGUF) beside the language model's, and tuner "
            "writes only the language model's, which would answer without seeing any image. Serve it with tuner "
            "serve (image_url parts), or convert it with llama.cpp's own convert_hf_to_gguf.py --mmproj.")
    layout_for(config)


def load_for_export(target: InferenceTarget):
    """(model, tokenizer) in the recipe's dtype on the CPU; a LoRA run's adapter merged into its base first."""
    from tuner.loading.merge import merged_model
    from tuner.loading.model import load_model, load_tokenizer

    recipe = target.recipe.model_copy(deep=True)
    recipe.method.quantization = None
    if target.adapter is not None:
        model, tokenizer = merged_model(recipe, target.adapter)
    else:
        model, tokenizer = load_model(recipe, target.model_path), load_tokenizer(recipe, target.tokenizer_path)
    return model.eval(), tokenizer


def check_prompts(target: InferenceTarget, tokenizer, data_format: str) -> tuple[list[str], str]:
    """Prompts to compare the file on, and what they are: the run's held-out samples, else its first training
    samples, else two fixed messages when the data cannot be read here."""
    from tuner.data.held_out import as_question, held_out_samples
    from tuner.data.prepare import split_samples
    from tuner.data.sources import DataError
    from tuner.infer.generate import render_prompt

    recipe = target.recipe
    try:
        try:
            samples, found = held_out_samples(recipe)
            what = "held-out samples"
        except DataError:
            train, _, found = split_samples(recipe)
            samples, what = [train[i] for i in range(min(CHECK_PROMPTS, len(train)))], "training samples"
        return [as_question(sample, found, tokenizer).prompt for sample in samples[:CHECK_PROMPTS]], what
    except DataError:
        messages = ["Hello", "What is 2 + 2?"]
        return ([render_prompt(tokenizer, [{"role": "user", "content": m}], data_format) for m in messages],
                "fixed messages (the data cannot be read here)")


def ollama_modelfile(target: InferenceTarget, tokenizer, gguf_name: str) -> tuple[str, str]:
    """(the Modelfile's text, the model name to create): the template as the run prompts, its stop tokens, the
    system prompt its data shares, and the recipe's sampling."""
    from tuner.data.chat_template import render_chat
    from tuner.data.formats import chat_template_for
    from tuner.export.modelfile import modelfile_text, ollama_name, template_pieces
    from tuner.infer.generate import user_turn
    from tuner.infer.prompt_format import trained_prompt_format

    found = trained_prompt_format(target.recipe)
    template = chat_template_for(tokenizer, found.data_format)

    def render(messages, generation):
        messages = [{**m, "content": user_turn(m["content"], found.instruction)} if m["role"] == "user" else m
                    for m in messages]
        return render_chat(tokenizer, messages, template, add_generation_prompt=generation)

    pieces = template_pieces(render)
    stops = list(dict.fromkeys(tokenizer.convert_ids_to_tokens(eos) for eos in _eos_ids(target, tokenizer)))
    inference = target.recipe.inference
    parameters = {"temperature": 0.0} if inference.greedy else {"temperature": inference.temperature,
                                                                 "top_p": inference.top_p}
    parameters["num_predict"] = inference.max_new_tokens
    name = ollama_name(target.recipe.name)
    return modelfile_text(gguf_name, pieces, stops, found.system, parameters), name


def _eos_ids(target: InferenceTarget, tokenizer) -> list[int]:
    """The ids that end an answer: the tokenizer's EOS and those the model's generation config adds (Llama 3's
    <|eot_id|>)."""
    from transformers import GenerationConfig

    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    try:
        configured = GenerationConfig.from_pretrained(target.model_path).eos_token_id
    except (OSError, ValueError):
        configured = None
    ids += configured if isinstance(configured, list) else [configured] if isinstance(configured, int) else []
    return ids


def export(target: InferenceTarget, fmt: str, quant: str, output: Path | None = None, force: bool = False,
           check: bool = False) -> ExportResult:
    """Write the GGUF (and Modelfile) of ``target``; see the module's docstring for the order of things."""
    from tuner.data.formats import chat_template_for
    from tuner.export.check import check_gguf
    from tuner.export.gguf_file import write_gguf
    from tuner.fileio import atomic_write_text, staged_directory
    from tuner.infer.prompt_format import trained_prompt_format
    from tuner.rundir.manifest import record_files

    output = output or default_output(target, quant)
    check_output(output, target, force)
    check_architecture(target)
    model, tokenizer = load_for_export(target)
    data_format = trained_prompt_format(target.recipe).data_format
    tokenizer.chat_template = chat_template_for(tokenizer, data_format)  # what tuner prompts with, in the metadata
    name = target.recipe.name
    gguf_name = f"{name.replace('/', '-')}-{quant}.gguf"
    modelfile = ollama_modelfile(target, tokenizer, gguf_name) if fmt == "ollama" else None  # refused before writing
    result = ExportResult(output, "", output / gguf_name)
    with staged_directory(output, existing="replace") as staging:
        summary = write_gguf(model, tokenizer, staging / gguf_name, quant, name)
        result.gguf_line = summary.line().replace(str(staging), str(output))
        if check:
            prompts, what = check_prompts(target, tokenizer, data_format)
            verdict = check_gguf(staging / gguf_name, model, tokenizer, prompts, quant)
            result.check_line = f"{verdict.line()} ({what})"
            if not verdict.passed:
                raise ExportCheckFailed(f"{result.check_line}; nothing was written.")
        if modelfile is not None:
            atomic_write_text(staging / MODELFILE, modelfile[0])
            result.modelfile = output / MODELFILE
            result.ollama_create = f"ollama create {modelfile[1]} -f {shlex.quote(str(output / MODELFILE))}"
        record_files(staging, sorted(entry.name for entry in staging.iterdir()), "tuner export")
    return result


class ExportCheckFailed(OSError):
    """The written file did not read back as the model it came from (exit code 1: a fault, not the user's input)."""
