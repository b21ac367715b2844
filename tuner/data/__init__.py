"""Training data: where samples come from, which layout they have, and what the model learns of each."""
