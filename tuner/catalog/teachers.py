"""Teachers tuner knows for a student: the built-in and catalog models of the student's family (its organisation on
the hub, or tuner's built-in models) with its vocabulary size and more parameters, largest first.

Distillation compares the two models' next-token distributions entry by entry, so a teacher must share the
student's tokenizer; within one family the vocabulary size stands for it here (the recipe check compares the
tokenizers themselves once both are on this machine: tuner.recipe.distill_checks).
"""
from __future__ import annotations

from functools import lru_cache

from tuner.catalog.demo import BUILTIN_MODELS, BUILTIN_PREFIX


def _family(model_id: str) -> str:
    return BUILTIN_PREFIX if model_id.startswith(BUILTIN_PREFIX) else model_id.split("/")[0] + "/"


def known_models() -> list[str]:
    """Every model id tuner has facts for without a download: its built-in models and its catalog."""
    from tuner.catalog.models import catalog_ids

    return [*BUILTIN_MODELS, *catalog_ids()]


@lru_cache(maxsize=64)
def teacher_candidates(student: str, revision: str | None = None) -> tuple[str, ...]:
    """The known models that can teach ``student``, the nearest in size first; empty when tuner knows none (or not
    the student)."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    try:
        facts = model_facts(student, revision)
    except (UnknownModelError, ValueError):
        return ()
    size = facts.param_counts.total
    found = []
    for model_id in known_models():
        if model_id == student or _family(model_id) != _family(student):
            continue
        candidate = model_facts(model_id)
        if candidate.vocab_size == facts.vocab_size and candidate.param_counts.total > size:
            found.append((candidate.param_counts.total, model_id))
    return tuple(model_id for _, model_id in sorted(found))
