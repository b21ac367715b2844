"""After training, hand the model on: GGUF files for llama.cpp and Ollama (``tuner export``).

gguf-py (llama.cpp's own ``gguf`` package) names the architectures, tensors and metadata keys; tuner maps a
trained model onto them (:mod:`tuner.export.gguf`, :mod:`tuner.export.vocab`), writes an Ollama Modelfile
(:mod:`tuner.export.modelfile`) and checks the file with an independent reader (:mod:`tuner.export.check`).
"""


class ExportRefused(Exception):
    """A model, tokenizer, template or quantisation that cannot be exported; said before anything is written,
    in words that say what to do (exit code 2)."""
