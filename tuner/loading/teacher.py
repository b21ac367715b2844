"""The teacher of a distill recipe, and TRL's GKD module that trains the student from it (tuner.train.distill) and
traces its step (tuner.loading.simulate)."""
from __future__ import annotations

from tuner.recipe.schema import Recipe


def gkd():
    """TRL's GKD module (trl.experimental.gkd), without its warning that experimental APIs may change: TRL's
    version is pinned (constraints.txt) and the tests hold tuner to this one."""
    import importlib
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return importlib.import_module("trl.experimental.gkd")


def load_teacher(recipe: Recipe):
    """The teacher, frozen, loaded as the student's base is (its dtype, attention and quantisation)."""
    from tuner.loading.model import load_model, resolve_model_path

    teacher = load_model(recipe, resolve_model_path(recipe.objective.teacher), revision=None)  # model.revision is the student's
    teacher.config.use_cache = False
    teacher.requires_grad_(False)  # and autocast then keeps no 16-bit copies of its weights in the step
    return teacher.eval()
