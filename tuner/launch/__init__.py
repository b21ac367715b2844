"""Launching: the exact ``accelerate launch`` argument list (pure) and the process runner."""
