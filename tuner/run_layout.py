"""Names inside a run directory that several floors share (training writes them; infer, merge and demo read them)."""

FINAL_DIR = "final"  # the trained model or adapter, its tokenizer and the lock recipe
CHECKPOINTS_DIR = "checkpoints"  # the Trainer's checkpoint-N folders
