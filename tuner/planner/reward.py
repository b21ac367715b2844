"""Memory terms of a reward model (objective.kind: reward) with TRL 1.16's RewardTrainer; sources in docs/memory.md.

- **The head** ``[trl-reward]``: AutoModelForSequenceClassification puts a ``score`` linear (hidden x 1, no bias)
  where the causal LM has its output head: its parameters replace the lm_head's (tied or not: the embeddings stay),
  and it is trained in full under LoRA (peft's SEQ_CLS task saves it beside the adapters).
- **The paired batch** ``[trl-reward]``: each micro-batch stacks its pairs' chosen sequences, then their rejected
  ones, in one forward (:func:`tuner.planner.preference.sequences_per_sample`).
- **The margin loss** ``[trl-reward]``: one score per position (s x b x 1, the head's output), of which the last
  token before padding is kept; ``-log sigmoid(chosen - rejected)`` over b pairs.  No vocabulary logits: the loss
  moment holds the final norm and the head's input, and scores a thousandth of SFT's T x V buffers' size.
"""
from __future__ import annotations

from dataclasses import replace

from tuner.planner.items import EVAL, FORWARD_BACKWARD, Item

SCORE_COPIES = 3  # the scores (s x b x 1) in fp32, their gradient, and the gathered last-token scores' margin


def reward_counts(model, counts):
    """The parameters of the model under its reward head: the score linear (hidden x 1) in place of the lm_head."""
    return replace(counts, lm_head=model.hidden_size)


def loss_items(s) -> list[Item]:
    """The margin loss at the end of the forward: the scores of every position and their gradient."""
    tokens = s.batch * s.seq
    return [Item("reward scores (s x b x 1) and the margin loss", "logits_loss", SCORE_COPIES * tokens * 4,
                 FORWARD_BACKWARD, "trl-reward")]


def eval_loss_items(s) -> list[Item]:
    """The held-out pairs' forward (accuracy and margin): the final norm's output and the scores, no gradients."""
    tokens = s.batch * s.seq
    return [Item("evaluation: the final norm's output and the scores (no gradients)", "logits_loss",
                 tokens * (s.facts.hidden_size * s.act_bytes + 4), EVAL, "trl-reward")]
