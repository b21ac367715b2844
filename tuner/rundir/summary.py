"""What a finished run says at its end, on the terminal and on the wizard's Run screen: where the model is, the
losses, the plan beside the measured memory, time and speed, and what to run next.  Read from the run's own
files (events.jsonl, memory.json), so a replayed run says the same."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tuner.rundir.events import Event, Finished, Step, read_events
from tuner.fileio import read_limited
from tuner.rundir.layout import EVAL_DIR, EVENTS_FILE, MEMORY_REPORT

ADAPTER_CONFIG = "adapter_config.json"  # peft's file: its presence makes a saved model an adapter
EVAL_READ_LIMIT = 16 << 20  # an eval/ result of tuner eval is kilobytes; more is not one it wrote


def adapter_base(folder: str | Path) -> str | None:
    """The model an adapter folder (peft's, e.g. a LoRA run's final/) was trained on; None for a whole model."""
    try:
        return json.loads((Path(folder) / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class RunSummary:
    run_dir: Path
    final_dir: str | None = None
    merged_dir: str | None = None
    first_loss: float | None = None
    last_loss: float | None = None
    eval_loss: float | None = None
    memory_line: str | None = None
    wall_s: float | None = None
    tokens_per_s: float | None = None
    steps: int | None = None
    notes: list[str] = field(default_factory=list)  # e.g. truncated or dropped samples
    evaluation: str | None = None  # the newest `tuner eval` result of the run, in one line
    pair_accuracy: tuple[float, float] | None = None  # a reward model's held-out pair accuracy, first and last eval

    @property
    def adapter(self) -> bool:
        return bool(self.final_dir) and (Path(self.final_dir) / ADAPTER_CONFIG).is_file()

    @property
    def reward_model(self) -> bool:
        """The run trained a reward model (a sequence-classification head): it scores text, it does not write any."""
        if not self.final_dir:
            return False
        final = Path(self.final_dir)
        try:
            if (final / ADAPTER_CONFIG).is_file():
                return json.loads((final / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("task_type") == "SEQ_CLS"
            architectures = json.loads((final / "config.json").read_text(encoding="utf-8")).get("architectures")
        except (OSError, ValueError, AttributeError):
            return False
        return any(name.endswith("ForSequenceClassification") for name in architectures or ())

    def next_commands(self) -> list[str]:
        run = shlex.quote(str(self.run_dir))
        if self.reward_model:
            return [f"score a grpo recipe's completions with it: objective.grpo.rewards: [{{kind: model, model: "
                    f"{run}}}]"]
        commands = [f'tuner infer {run} --prompt "..."', f"tuner chat {run}"]
        if self.adapter and not self.merged_dir:
            commands.append(f"tuner merge {run}")
        commands += [f"tuner eval {run} --baseline", f"tuner export {run} --format ollama"]
        return commands

    def lines(self) -> list[str]:
        what = "adapter" if self.adapter else "model"
        took = f" in {self.wall_s:.0f} s" if self.wall_s is not None else ""
        lines = [f"finished{took}: {self.steps if self.steps is not None else '?'} steps; {what} saved in "
                 f"{self.final_dir or '(not saved)'}" + (f", merged model in {self.merged_dir}" if self.merged_dir else "")]
        losses = []
        if self.first_loss is not None and self.last_loss is not None:
            losses.append(f"train loss {self.first_loss:.4f} -> {self.last_loss:.4f}")
        if self.eval_loss is not None:
            losses.append(f"held-out loss {self.eval_loss:.4f}")
        if self.pair_accuracy is not None:
            losses.append("held-out pair accuracy " + " -> ".join(f"{value:.1%}" for value in self.pair_accuracy))
        if self.tokens_per_s is not None:
            losses.append(f"{self.tokens_per_s:,.0f} tokens/s")
        if losses:
            lines.append("  " + ", ".join(losses))
        if self.memory_line:
            lines.append(f"  memory: {self.memory_line}")
        if self.evaluation:
            lines.append(f"  eval: {self.evaluation}")
        lines += [f"  note: {note}" for note in self.notes]
        lines.append("next:")
        lines += [f"  {command}" for command in self.next_commands()]
        return lines


def latest_evaluation(run_dir: Path, since: float = 0.0) -> str | None:
    """The newest ``eval/eval-*.json`` of the run (written by ``tuner eval``) at or after ``since`` (the training it
    evaluated finished then) as one line: each task's first metric per model, e.g. ``held_out exact_match 0 -> 0.38``."""
    try:
        newest = max((run_dir / EVAL_DIR).glob("eval-*.json"), key=lambda path: path.stat().st_mtime, default=None)
        if newest is None:
            return None
        document = json.loads(read_limited(newest, EVAL_READ_LIMIT, pipes=False))
        if document.get("time", 0) < since:  # an evaluation of the model an earlier training left there
            return None
        models = document["models"]
        tasks = dict.fromkeys(task for model in models for task in model["scores"])
        parts = []
        for task in tasks:
            metric = next(iter(next(m["scores"][task] for m in models if task in m["scores"])))
            values = [m["scores"].get(task, {}).get(metric) for m in models]
            parts.append(f"{task} {metric} " + " -> ".join("-" if v is None else f"{v:.3g}" for v in values))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration):
        return None
    labels = " -> ".join(m.get("label", "?") for m in models)
    return f"{'; '.join(parts)} ({labels}; {newest.relative_to(run_dir)})"


def summarize_run(run_dir: str | Path, since: float = 0.0, wall_s: float | None = None,
                  events: list[Event] | None = None) -> RunSummary | None:
    """The summary of the run's last finished training (events at or after ``since``), or None if none finished;
    ``events``: the run's events when the caller has read them already."""
    run_dir = Path(run_dir)
    events = read_events(run_dir / EVENTS_FILE) if events is None else events
    events = [e for e in events if e.time is None or e.time >= since]
    finished = next((e for e in reversed(events) if isinstance(e, Finished)), None)
    if finished is None:
        return None
    losses = [e.number("loss") for e in events if type(e) is Step and e.number("loss") is not None]
    evals = [e.number("eval_loss") for e in events if e.number("eval_loss") is not None]
    accuracies = [e.number("eval_accuracy") for e in events if e.number("eval_accuracy") is not None]  # reward
    speeds = [e.number("tokens_per_s") for e in events if e.number("tokens_per_s") is not None]
    memory_line = None
    try:
        memory_line = json.loads((run_dir / MEMORY_REPORT).read_text(encoding="utf-8")).get("line")
    except (OSError, ValueError, AttributeError):
        pass
    notes = []
    if finished.truncated:
        notes.append(f"{finished.truncated} training samples were cut to training.max_seq_length")
    if finished.dropped:
        notes.append(f"{finished.dropped} training samples had no token to learn from and were dropped")
    if finished.truncated is None:  # every finished event carries the count; None: the data was streamed
        notes.append("samples cut to training.max_seq_length or dropped with no token to learn from were not counted "
                     "(the data was streamed)")
    runtime = finished.number("train_runtime")
    return RunSummary(
        run_dir=run_dir, final_dir=finished.final_dir, merged_dir=finished.merged_dir,
        first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None,
        eval_loss=evals[-1] if evals else None, memory_line=memory_line,
        wall_s=wall_s if wall_s is not None else (float(runtime) if runtime is not None else None),
        tokens_per_s=speeds[-1] if speeds else None, steps=finished.step, notes=notes,
        pair_accuracy=(accuracies[0], accuracies[-1]) if accuracies else None,
        evaluation=latest_evaluation(run_dir, since=finished.time or 0))
