"""``tuner eval``: a trained run (or a recipe's model, or ``--model``) through EleutherAI's lm-evaluation-harness.

The model is loaded by tuner (:func:`tuner.infer.load.load_for_inference`: adapter, dtype, device_map) and handed to
the harness's own HF adapter (:mod:`tuner.evaluate.harness`); tasks are the harness's, named with ``--tasks``, plus
one built from the recipe's held-out split (:mod:`tuner.evaluate.tasks`); results go under the run
(:mod:`tuner.evaluate.results`).
"""


class TaskDataMissing(OSError):
    """A task's data is neither local nor reachable (offline): an environment error (exit code 1) naming the
    dataset."""
