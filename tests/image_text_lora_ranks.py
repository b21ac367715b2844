"""LoRA on an image-text model over two gloo ranks under DeepSpeed ZeRO, as a user runs it (`tuner run demo-vlm
--set ...`): shared by the tiny Gemma 3 / Qwen2.5-VL tests and the trained demo-vlm's."""
from __future__ import annotations

import random
from pathlib import Path

PICTURES = (("blue", "circle"), ("red", "square"))


def train_then_resume(tuner_cli, cwd: Path, name: str, model: str, stage: int, *settings: str) -> tuple[Path, str]:
    """Two steps checkpointing each, then a third resumed from checkpoint-2 (a constant learning rate: a finished
    cosine schedule leaves the resumed step at zero); the run directory and the resumed run's output."""
    from test_cpu_ranks import free_port

    common = [f"name={name}", f"output.dir=runs/{name}", f"model.id={model}", "method.kind=lora",
              "memory.distributed=deepspeed", f"memory.zero_stage={stage}", "hardware.num_processes=2",
              "training.save_steps=1", "training.warmup_steps=0", "training.logging_steps=1",
              "training.lr_scheduler=constant", *settings]

    def run(max_steps: int, *extra: str) -> str:
        overrides = [*common, f"training.max_steps={max_steps}", f"hardware.main_process_port={free_port()}"]
        done = tuner_cli("run", "demo-vlm", *(arg for setting in overrides for arg in ("--set", setting)), *extra,
                         cwd=cwd, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
        return done.stderr + done.stdout

    assert "adapter saved" in run(2)
    resumed = run(3, "--resume")
    assert f"resuming from runs/{name}/checkpoints/checkpoint-2" in resumed and "3 steps" in resumed, resumed
    return cwd / "runs" / name, resumed


def answers_by_picture(tuner_cli, cwd: Path, *models: Path) -> dict[str, list[str]]:
    """What each model answers through `tuner infer --image` about each of two drawn pictures."""
    from tuner.data.shapes import draw_shape

    answers: dict[str, list[str]] = {}
    for colour, shape in PICTURES:
        draw_shape(shape, colour, random.Random(3)).save(cwd / f"{colour}.png")
        for model in models:
            said = tuner_cli("infer", str(model), "--image", f"{colour}.png", "--prompt", "what is drawn?", cwd=cwd)
            assert said.returncode == 0, said.stderr[-2000:]
            answers.setdefault(colour, []).append(said.stdout.strip())
    return answers
