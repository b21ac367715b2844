"""Inference: generation, batch answers and chat on a loaded model."""
