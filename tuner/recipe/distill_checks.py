"""Cross-field rules of distillation: a teacher that shares the student's tokenizer, and what GKD cannot train with.

TRL's GKDTrainer compares the teacher's whole next-token distribution with the student's, position by position, so
both must number the same tokens the same way.  TRL itself checks only the vocabulary sizes, after both models
loaded; here the same rule (in TRL's words) and, where both tokenizers are on this machine, their token ids are
checked before anything runs.
"""
from __future__ import annotations

import json
from pathlib import Path

from tuner.recipe.model_checks import remote_code_problem
from tuner.recipe.problem import Problem
from tuner.recipe.schema import Recipe

TOKENIZER_FILE = "tokenizer.json"


def _vocab_size(model_id: str, revision: str | None, trust_remote_code: bool) -> int | None:
    """The model's vocabulary size from its config (catalog, local folder, hub cache), or None when unknown."""
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    try:
        return model_facts(model_id, revision, trust_remote_code).vocab_size
    except (UnknownModelError, ValueError):
        return None  # not there yet (a run to train first) or unreadable: the loader says why when it loads


def _tokenizer_folder(model_id: str) -> Path | None:
    """Where the model's tokenizer.json is on this machine (a local folder, a built built-in model), else None."""
    from tuner.catalog.demo import builtin_model, demo_model_dir, is_builtin
    from tuner.fileio import user_path

    if is_builtin(model_id):
        try:
            builtin_model(model_id)
        except ValueError:
            return None
        return demo_model_dir(model_id)
    try:
        path = user_path(model_id)
        return path if path.is_dir() else None
    except (OSError, ValueError):
        return None


def token_ids(model_id: str) -> dict[str, int] | None:
    """The token -> id map of the model's fast tokenizer (its vocabulary and added tokens), or None when there is
    no readable tokenizer.json here."""
    folder = _tokenizer_folder(model_id)
    try:
        data = json.loads((folder / TOKENIZER_FILE).read_text(encoding="utf-8")) if folder else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, list):  # Unigram: [token, score] pairs in id order
        vocab = {str(entry[0]): index for index, entry in enumerate(vocab) if isinstance(entry, list) and entry}
    if not isinstance(vocab, dict):
        return None
    ids = {str(token): index for token, index in vocab.items() if isinstance(index, int)}
    for added in data.get("added_tokens") or ():
        if isinstance(added, dict) and isinstance(added.get("id"), int):
            ids[str(added.get("content"))] = added["id"]
    return ids


def tokenizer_problem(student: str, teacher: str, student_size: int | None, teacher_size: int | None) -> str | None:
    """Why ``teacher`` cannot teach ``student`` token by token: other vocabulary sizes (TRL's own check, in its
    words), or the same size with tokens numbered differently; None when they agree or cannot be compared here."""
    shared = ("Distillation compares the teacher's full next-token distribution, which requires a shared "
              "vocabulary. Use a teacher with the same tokenizer (set objective.teacher), or another student "
              "(model.id).")
    if student_size is not None and teacher_size is not None and student_size != teacher_size:
        return (f"The student model has vocab_size {student_size} but the teacher model has vocab_size "
                f"{teacher_size} ({student} and {teacher}). {shared}")
    student_ids, teacher_ids = token_ids(student), token_ids(teacher)
    if student_ids is None or teacher_ids is None:
        return None
    differ = sorted(token for token in student_ids.keys() | teacher_ids.keys()
                    if student_ids.get(token) != teacher_ids.get(token))
    if not differ:
        return None
    token = differ[0]
    return (f"The teacher's tokenizer ({teacher}) numbers {len(differ)} tokens other than the student's ({student}): "
            f"{token!r} is id {student_ids.get(token)} for the student and {teacher_ids.get(token)} for the "
            f"teacher. {shared}")


def _distill(recipe: Recipe) -> list[Problem]:
    objective, data, model = recipe.objective, recipe.data, recipe.model
    if objective.kind != "distill":
        return [Problem(f"objective.{field}", f"objective.{field} is a distill setting: remove it, or set "
                                              "objective.kind: distill.")
                for field in ("teacher", "distill") if getattr(objective, field) is not None]
    if objective.teacher is None:
        return [Problem("objective.teacher", "distill learns from a teacher: set objective.teacher to a model sharing "
                                             "the student's tokenizer (a local folder, a hub id or a built-in model).",
                        anchor="objective.kind")]
    problems = []
    code = remote_code_problem(objective.teacher, None, model.trust_remote_code)
    if code:
        problems.append(Problem("objective.teacher", code))
    mismatch = tokenizer_problem(model.id, objective.teacher,
                                 _vocab_size(model.id, model.revision, model.trust_remote_code),
                                 _vocab_size(objective.teacher, None, model.trust_remote_code))
    if mismatch:
        problems.append(Problem("objective.teacher", mismatch))
    for field, why in (("packing", "feeds the teacher and the student one padded sequence per sample (GKD passes "
                                   "no per-sample positions)"),
                       ("streaming", "samples the student's prompts from a dataset it indexes")):
        if getattr(data, field):
            problems.append(Problem(f"data.{field}", f"distill {why}: set {field}: false."))
    if recipe.memory.chunked_loss:
        problems.append(Problem("memory.chunked_loss", "distillation compares the teacher's and the student's full "
                                                       "logits: set chunked_loss: false."))
    if recipe.parallelism.model_parallel > 1:
        problems.append(Problem("parallelism", "distill is trained with data parallelism here (tp, cp and sp are not "
                                               "tested with TRL's GKDTrainer): set tp, cp and sp to 1."))
    if objective.distill.max_new_tokens >= recipe.training.max_seq_length:
        problems.append(Problem(
            "objective.distill.max_new_tokens", f"{objective.distill.max_new_tokens} sampled tokens leave no room for "
            f"the prompt within training.max_seq_length ({recipe.training.max_seq_length}), which the memory plan is "
            "made for: lower max_new_tokens, or raise max_seq_length.", anchor="objective.distill"))
    return problems
