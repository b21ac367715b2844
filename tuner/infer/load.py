"""Load a model for inference with ``device_map="auto"``: GPUs first, then CPU RAM, then disk.

The budget comes from the recipe's hardware (:func:`tuner.infer.placement.hardware_memory_map`) unless
the caller passes ``max_memory``; the placement report is taken before any adapter wraps the model.
"""
from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tuner.infer.placement import DISK, GIB, Placement, hardware_memory_map, placement_of
from tuner.infer.target import InferenceTarget
from tuner.loading.model import (ModelLoadError, is_image_text, load_model, load_processor, load_tokenizer,
                                 quantization_config)
from tuner.reason import library_words
from tuner.recipe.schema import QuantizationSection
from tuner.rundir.layout import OFFLOAD_DIR

log = logging.getLogger("tuner")

CPU_DTYPE = "float32"  # what CPU kernels run fastest and every checkpoint dtype converts to exactly


@dataclass
class LoadedModel:
    """A model ready to generate, its tokenizer, and where its parts went."""

    model: object
    tokenizer: object
    placement: Placement
    target: InferenceTarget
    # keeps a temporary offload folder alive (and removes it) together with the model
    offload_tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)
    processor: object | None = None  # an image-text model's: images become its tokens (tuner.infer.images)


def default_context(target: InferenceTarget, max_new_tokens: int) -> int:
    """Context the KV cache is predicted for: the recipe's sequence length plus the answer."""
    return target.recipe.training.max_seq_length + max_new_tokens


def inference_dtype(target: InferenceTarget, on_gpu: bool) -> tuple[str, str | None]:
    """(the dtype to load the weights in, a note when it is not the recipe's): on a CPU float32, unless the recipe
    or a --set names model.dtype; a dtype that only follows the training's mixed precision is no choice for
    inference, and CPUs run 16-bit weights slowly."""
    dtype = target.recipe.model.dtype
    if on_gpu or target.dtype_chosen or dtype == CPU_DTYPE:
        return dtype, None
    return CPU_DTYPE, (f"weights in {CPU_DTYPE} on the CPU: model.dtype {dtype} follows the training's mixed "
                       f"precision, which CPUs run slowly (--set model.dtype={dtype} keeps it).")


def load_for_inference(target: InferenceTarget, *, batch: int = 1, context: int, bits: int | None = None,
                       max_memory: dict[int | str, int | str] | None = None,
                       offload_folder: str | Path | None = None) -> LoadedModel:
    """Place the model over GPUs, CPU and disk, apply the adapter, and report the placement.

    ``bits`` (4 or 8) quantises the base weights with bitsandbytes; modules that land on CPU or disk then
    stay in 16/32-bit (``llm_int8_enable_fp32_cpu_offload``), as bitsandbytes cannot run them there.
    """
    recipe = target.recipe.model_copy(deep=True)
    if bits is not None:
        recipe.method.quantization = QuantizationSection(bits=bits)
    notes: list[str] = []
    if max_memory is None:
        max_memory, notes = hardware_memory_map(recipe, target.use_recipe_hardware)
    on_gpu = any(isinstance(device, int) for device in max_memory)
    recipe.model.dtype, note = inference_dtype(target, on_gpu)
    notes += [note] if note else []
    quantization = quantization_config(recipe)
    if quantization is not None:
        quantization.llm_int8_enable_fp32_cpu_offload = True
        if not on_gpu:
            notes.append(f"{recipe.method.quantization.bits}-bit weights without a GPU: bitsandbytes runs k-bit "
                         "layers on the CPU slowly and not for every layer shape; quantised loading pays off on GPUs.")
    offload_tmp = None
    folder = offload_folder or target.offload_folder
    if folder is None:
        offload_tmp = tempfile.TemporaryDirectory(prefix="tuner-offload-")
        folder = offload_tmp.name
    elif target.run_dir is not None and Path(folder) == target.run_dir / OFFLOAD_DIR:
        _check_run_offload(Path(folder))
    model = load_model(recipe, target.model_path, device_map="auto", max_memory=max_memory,
                       offload_folder=str(folder), quantization_config=quantization)
    model.eval()
    placement = placement_of(model, batch, context, _numeric(max_memory), int(recipe.inference.gpu_headroom_gb * GIB),
                             tuple(notes), planner_facts(target))
    if target.adapter is not None:
        model = _with_adapter(model, target.adapter, placement, max_memory, folder)
    processor = None
    if is_image_text(model.config.to_dict()):
        processor = load_processor(recipe, target.tokenizer_path)
        tokenizer = processor.tokenizer
    else:
        tokenizer = load_tokenizer(recipe, target.tokenizer_path)
    return LoadedModel(model, tokenizer, placement, target, offload_tmp, processor)


def _check_run_offload(folder: Path) -> None:
    """The run's own offload/ folder, where accelerate writes weights: never through a link, never a file."""
    from tuner.fileio import DestinationRefused, check_destination

    try:
        check_destination(folder)
    except DestinationRefused as exc:
        raise ModelLoadError(f"{exc} (weights offloaded to disk are written there)") from None


def _with_adapter(model, adapter: Path, placement: Placement, max_memory, offload_folder):
    """The base model wrapped with the LoRA adapter, re-placed by peft within the same budget.

    Weights offloaded to disk are refused: with transformers 5 / peft 0.21 the adapter weights of
    disk-offloaded layers are silently dropped (and peft may rewrite the base checkpoint's files).
    """
    from peft import PeftModel

    disk = placement.row(DISK)
    if disk is not None and disk.weights_bytes:
        raise ModelLoadError(
            f"cannot apply the adapter in {adapter}: {disk.layers} layer(s) of the base model would be offloaded to "
            "disk, and adapters on disk-offloaded layers are lost. Merge the adapter into the base model and run the "
            "merged folder (output.save: merged), or give the model more room: --max-memory cpu=SIZE, "
            "hardware.host_ram_gb, or --bits 4.")
    try:
        wrapped = PeftModel.from_pretrained(model, str(adapter), max_memory=max_memory,
                                            offload_folder=str(offload_folder))
    except Exception as exc:  # a damaged or mismatched adapter file, whatever peft raises for it
        reason = library_words(exc, 500)
        raise ModelLoadError(f"cannot apply the adapter in {adapter} to this base model ({type(exc).__name__}: "
                             f"{reason}).") from None
    wrapped.eval()
    return wrapped


def planner_facts(target: InferenceTarget):
    """The planner's facts for the model (catalog, local config.json or hub cache); None when it has none."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    model = target.recipe.model
    try:
        return model_facts(target.model_path, model.revision, model.trust_remote_code)
    except UnknownModelError:
        return None


def _numeric(max_memory: dict[int | str, int | str]) -> dict[int | str, int]:
    """Budgets in bytes (accelerate also accepts strings such as '20GiB')."""
    from accelerate.utils.modeling import convert_file_size_to_int

    return {device: convert_file_size_to_int(size) for device, size in max_memory.items()}
