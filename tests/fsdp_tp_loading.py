"""transformers' tensor-parallel loading as the entrypoint does it for distributed: fsdp with tp, on CPU ranks, for
tests/test_tensor_parallel.py (run by torchrun on gloo):

    python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_tp_loading.py OUT_DIR MODEL_DIR

Each rank loads the model with tuner's own loading arguments (``DistributedConfig``), records the weights' local
shapes and the loss of one fixed batch, then builds the Trainer, which this CPU cannot run the path with: each rank
writes OUT_DIR/rank<R>.json with the shapes, the loss and the Trainer's error.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(out_dir: str, model_dir: str) -> int:
    import torch
    from transformers import Trainer, TrainingArguments

    from tuner.loading.model import load_model
    from tuner.recipe.schema import Recipe
    from tuner.train.parallelism import loading_arguments

    # the schema only: the recipe checks refuse fsdp on CPU ranks, which is what this shows from the inside
    recipe = Recipe.model_validate({
        "model": {"id": model_dir, "dtype": "float32"},
        "hardware": {"gpus_per_machine": 0, "num_processes": int(os.environ["WORLD_SIZE"])},
        "memory": {"distributed": "fsdp", "mixed_precision": "no", "attention": "sdpa"},
        "parallelism": {"tp": int(os.environ["WORLD_SIZE"])}})
    model = load_model(recipe, **loading_arguments(recipe))
    shapes = {name: list(getattr(p, "to_local", lambda p=p: p)().shape) for name, p in model.named_parameters()}
    ids = torch.arange(2, 34).reshape(2, 16) % model.config.vocab_size
    with torch.no_grad():
        loss = float(model(input_ids=ids, labels=ids).loss)
    try:
        Trainer(model=model, args=TrainingArguments(output_dir=str(Path(out_dir) / "trainer"), use_cpu=True,
                                                    report_to=[], save_strategy="no"))
        refused = None
    except ValueError as exc:
        refused = str(exc)
    rank = int(os.environ["RANK"])
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"shapes": shapes, "loss": loss, "refused": refused}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
