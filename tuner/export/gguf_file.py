"""Write a trained model as one GGUF file with gguf-py: its architecture's tensor names and hyperparameter keys, the
tokenizer (:mod:`tuner.export.vocab`) and chat template, in f16, bf16 or q8_0.

What tuner trains and gguf-py lays out (``LAYOUTS``): Llama and Mistral (llama.cpp's ``llama``: q and k rows
permuted as its rotary embedding expects), Qwen2, Qwen3 and Gemma 2 (RMSNorm weights stored as 1 + w).  Every
check runs before the file is opened: an architecture, a rotary scaling, a tensor without a GGUF name, a
tokenizer without a GGUF form.  Tensors are converted and written one at a time, so memory holds the model and
one converted tensor.  As llama.cpp's converter does, 1-D tensors stay float32 and a q8_0 tensor whose rows are
not whole blocks of 32 stays f16.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from tuner.export import QUANT_NAMES, ExportRefused
from tuner.export.vocab import gguf_vocab, write_vocab

QUANTS = {  # --quant: (tensor type of 2-D weights, the file type written in general.file_type)
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}
assert tuple(QUANTS) == QUANT_NAMES


@dataclass(frozen=True)
class Layout:
    """How one transformers architecture maps onto a gguf-py architecture."""

    arch: gguf.MODEL_ARCH
    permute_qk: bool = False  # llama.cpp's llama graph wants q/k rows interleaved per head, as Meta's checkpoints had them
    norm_offset: float = 0.0  # Gemma's RMSNorm scales by (1 + w); llama.cpp's weight is that sum
    rope_factors: bool = False  # llama.cpp's graph reads a rope_freqs tensor (Llama 3.1's frequency scaling)
    extra: Callable[[gguf.GGUFWriter, object], None] | None = None


def _gemma2_keys(writer: gguf.GGUFWriter, config) -> None:
    if config.query_pre_attn_scalar != _head_dim(config):
        raise ExportRefused(f"Gemma 2 with query_pre_attn_scalar {config.query_pre_attn_scalar} != head_dim "
                            f"{_head_dim(config)} (the 27B) is not exported: llama.cpp picks that attention scale "
                            "by model size, not from the file.")
    writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
    writer.add_final_logit_softcapping(config.final_logit_softcapping)
    writer.add_sliding_window(config.sliding_window)


LAYOUTS = {  # config.model_type -> Layout
    "llama": Layout(gguf.MODEL_ARCH.LLAMA, permute_qk=True, rope_factors=True),
    "mistral": Layout(gguf.MODEL_ARCH.LLAMA, permute_qk=True, rope_factors=True),
    "qwen2": Layout(gguf.MODEL_ARCH.QWEN2),
    "qwen3": Layout(gguf.MODEL_ARCH.QWEN3),
    "gemma2": Layout(gguf.MODEL_ARCH.GEMMA2, norm_offset=1.0, extra=_gemma2_keys),
}


def layout_for(config) -> Layout:
    """The layout of a model's architecture; :class:`ExportRefused` naming it when tuner does not export it."""
    layout = LAYOUTS.get(config.model_type)
    if layout is None:
        architecture = (getattr(config, "architectures", None) or [config.model_type])[0]
        raise ExportRefused(f"{architecture} (model_type {config.model_type!r}) is not exported to GGUF; tuner "
                            f"exports {', '.join(sorted(LAYOUTS))}. llama.cpp's convert_hf_to_gguf.py may know it: "
                            "run it on the run's final/ (or merged/) folder.")
    return layout


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope_theta(config) -> float:
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def rope_frequency_factors(config, layout: Layout) -> np.ndarray | None:
    """llama.cpp's ``rope_freqs`` (each rotary frequency is divided by its factor) for a rotary scaling that only
    rescales frequencies (linear, llama3), from transformers' own frequencies; None for the default rotary."""
    parameters = dict(getattr(config, "rope_parameters", None) or {})
    kind = parameters.get("rope_type", "default")
    if kind == "default":
        return None
    if not layout.rope_factors or kind not in ("linear", "llama3"):
        raise ExportRefused(f"rotary scaling {kind!r} of {config.model_type} is not exported to GGUF (tuner writes "
                            "linear and llama3 scaling for Llama-layout models).")
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, attention_factor = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"))
    dim = _head_dim(config)
    plain = 1.0 / (_rope_theta(config) ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if not math.isclose(attention_factor, 1.0):
        raise ExportRefused(f"rotary scaling {kind!r} also scales attention ({attention_factor}); not exported.")
    return (plain / scaled.float()).numpy().astype(np.float32)


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """Rows of each head reordered from halves (transformers' rotary) to interleaved pairs (llama.cpp's, Meta's)."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


@dataclass(frozen=True)
class PlannedTensor:
    gguf_name: str
    source: str | None  # the state-dict key, or None for a tensor tuner derives (rope_freqs)
    shape: tuple[int, ...]
    kind: gguf.GGMLQuantizationType


@dataclass
class GGUFSummary:
    path: Path
    quant: str
    architecture: str
    tensors: dict[str, int] = field(default_factory=dict)  # tensor type name -> count
    kept_f16: list[str] = field(default_factory=list)  # q8_0 tensors whose rows are not whole blocks

    def line(self) -> str:
        counts = ", ".join(f"{count} {kind}" for kind, count in sorted(self.tensors.items()))
        kept = (f"; {len(self.kept_f16)} tensor(s) kept in f16, their rows not whole q8_0 blocks of 32"
                if self.kept_f16 else "")
        return f"{self.path}: GGUF {self.architecture}, {self.quant} ({counts}){kept}"


def _tensor_kind(shape: tuple[int, ...], quant: str) -> gguf.GGMLQuantizationType:
    kind = QUANTS[quant][0]
    if len(shape) < 2:
        return gguf.GGMLQuantizationType.F32
    block = gguf.GGML_QUANT_SIZES[kind][0]
    return kind if shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16


def plan_tensors(model, layout: Layout, quant: str) -> list[PlannedTensor]:
    """Every tensor the file will hold, named and typed, before anything is written; a weight without a GGUF name
    is refused."""
    config = model.config
    names = gguf.get_tensor_name_map(layout.arch, config.num_hidden_layers)
    planned = []
    tied = getattr(config, "tie_word_embeddings", False)
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and tied:
            continue  # llama.cpp reads the embedding matrix when the file has no output.weight
        base, _, suffix = key.rpartition(".")
        name = names.get_name(base)
        if name is None:
            raise ExportRefused(f"weight {key} has no GGUF name in gguf-py's {gguf.MODEL_ARCH_NAMES[layout.arch]} "
                                "layout; this model is not exported.")
        shape = tuple(tensor.shape)
        planned.append(PlannedTensor(f"{name}.{suffix}", key, shape, _tensor_kind(shape, quant)))
    factors = rope_frequency_factors(config, layout)
    if factors is not None:
        planned.append(PlannedTensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", None, factors.shape,
                                     gguf.GGMLQuantizationType.F32))
    return planned


def _converted(data: np.ndarray, kind: gguf.GGMLQuantizationType) -> np.ndarray:
    if kind == gguf.GGMLQuantizationType.F32:
        return data.astype(np.float32)
    if kind == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16)
    return gguf.quants.quantize(data.astype(np.float32), kind)


class _Writer(gguf.GGUFWriter):
    """gguf-py's writer, which also writes an empty array (GGUF allows one; gguf-py refuses it): a BPE vocabulary
    without merges still needs the merges key for llama.cpp to load it."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0 and sub_type is not None:
            return (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _hyperparameters(writer: gguf.GGUFWriter, config, layout: Layout, vocab_rows: int) -> None:
    """The keys llama.cpp's converter writes for these architectures (TextModel.set_gguf_parameters and the
    architecture's own)."""
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(_head_dim(config))
    writer.add_value_length(_head_dim(config))
    writer.add_rope_dimension_count(_head_dim(config))
    writer.add_vocab_size(vocab_rows)
    if layout.extra:
        layout.extra(writer, config)


def write_gguf(model, tokenizer, path: Path, quant: str, name: str) -> GGUFSummary:
    """Write ``model`` (a transformers causal LM in memory) and ``tokenizer`` to the GGUF file ``path``.

    Every refusal (:class:`ExportRefused`) comes before ``path`` is opened."""
    import torch

    if quant not in QUANTS:
        raise ExportRefused(f"--quant {quant}: not one of {', '.join(QUANTS)}.")
    config = model.config
    layout = layout_for(config)
    rows = model.get_input_embeddings().weight.shape[0]
    vocab = gguf_vocab(tokenizer, rows)
    planned = plan_tensors(model, layout, quant)
    arch_name = gguf.MODEL_ARCH_NAMES[layout.arch]
    writer = _Writer(path, arch_name)
    writer.add_name(name)
    writer.add_file_type(QUANTS[quant][1])
    if quant == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _hyperparameters(writer, config, layout, rows)
    write_vocab(writer, vocab, tokenizer)
    for tensor in planned:
        byte_shape = tensor.shape if tensor.kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) \
            else gguf.quant_shape_to_byte_shape(tensor.shape, tensor.kind)
        width = {gguf.GGMLQuantizationType.F32: 4, gguf.GGMLQuantizationType.F16: 2}.get(tensor.kind, 1)
        writer.add_tensor_info(tensor.gguf_name, tensor.shape, np.dtype(np.float32), int(np.prod(byte_shape)) * width,
                               raw_dtype=tensor.kind)
    summary = GGUFSummary(path, quant, arch_name)
    state = model.state_dict()
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    factors = rope_frequency_factors(config, layout)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in planned:
            if tensor.source is None:
                data = factors
            else:
                with torch.no_grad():
                    data = state[tensor.source].detach().to("cpu", torch.float32).numpy()
                if layout.permute_qk and tensor.source.endswith("q_proj.weight"):
                    data = _permute(data, heads)
                elif layout.permute_qk and tensor.source.endswith("k_proj.weight"):
                    data = _permute(data, kv_heads)
                if layout.norm_offset and tensor.source.endswith("norm.weight"):
                    data = data + layout.norm_offset
            writer.write_tensor_data(_converted(data, tensor.kind))
            kind = tensor.kind.name
            summary.tensors[kind] = summary.tensors.get(kind, 0) + 1
            if quant == "q8_0" and tensor.kind == gguf.GGMLQuantizationType.F16:
                summary.kept_f16.append(tensor.gguf_name)
    finally:
        writer.close()
    return summary
