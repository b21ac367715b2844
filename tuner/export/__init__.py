"""After training, hand the model on: GGUF files for llama.cpp and Ollama (``tuner export``).

gguf-py (llama.cpp's own ``gguf`` package) names the architectures, tensors and metadata keys; tuner maps a
trained model onto them (:mod:`tuner.export.gguf`, :mod:`tuner.export.vocab`), writes an Ollama Modelfile
(:mod:`tuner.export.modelfile`) and checks the file with an independent reader (:mod:`tuner.export.check`).
"""

# --quant: what 2-D weights are stored as (tuner.export.gguf_file.QUANTS); named here, where the parser reads them
QUANT_NAMES = ("f16", "bf16", "q8_0")
FORMATS = ("gguf", "ollama")  # --format: the GGUF file alone, or with an Ollama Modelfile beside it


class ExportRefused(Exception):
    """A model, tokenizer, template or quantisation that cannot be exported; said before anything is written,
    in words that say what to do (exit code 2)."""
