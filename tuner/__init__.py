"""tuner: declarative fine-tuning with a memory planner, built on Hugging Face Accelerate."""

__version__ = "0.1.0"
