"""Read an exported GGUF back with a reader tuner did not write, transformers' own GGUF loader
(``from_pretrained(..., gguf_file=...)``), and compare it with the model it came from: the token ids of each
prompt, the logits, and the greedy next token.

Tolerances: the largest logit difference relative to the largest logit (so one number holds for small and large
logits); f16 and bf16 round every weight to 11 and 8 significant bits, q8_0 to 8-bit blocks of 32 with an f16
scale.  What was measured: docs/inference.md, "Export".
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LOGIT_TOLERANCE = {"f16": 0.005, "bf16": 0.02, "q8_0": 0.06}  # of the largest |logit|


@dataclass(frozen=True)
class ReaderCheck:
    prompts: int
    same_ids: bool  # every prompt tokenised to the same ids by both tokenizers
    max_logit_diff: float
    largest_logit: float
    same_next_token: int  # prompts whose most likely next token is the same
    tolerance: float

    @property
    def relative_diff(self) -> float:
        return self.max_logit_diff / max(self.largest_logit, 1e-9)

    @property
    def passed(self) -> bool:
        return self.same_ids and self.relative_diff <= self.tolerance

    def line(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (f"transformers' GGUF reader: {verdict} on {self.prompts} prompt(s): token ids "
                f"{'identical' if self.same_ids else 'DIFFER'}, largest logit difference {self.max_logit_diff:.2g} "
                f"= {self.relative_diff:.2g} of the largest |logit| {self.largest_logit:.3g} (tolerance {self.tolerance:g}), same next token on {self.same_next_token}/{self.prompts}")


def read_back(path: Path):
    """(model, tokenizer) as transformers builds them from the GGUF file alone, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # the whole path: transformers takes a bare file name that exists in the current folder over the one in ``folder``
    folder, file = str(path.parent.resolve()), str(path.resolve())
    return (AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(folder, gguf_file=file))


def check_gguf(path: Path, model, tokenizer, prompts: list[str], quant: str) -> ReaderCheck:
    """Compare the file at ``path`` with ``model`` and ``tokenizer`` on ``prompts`` (as the model is prompted)."""
    import torch

    gguf_model, gguf_tokenizer = read_back(path)
    same_ids, largest, scale, same_next = True, 0.0, 0.0, 0
    for prompt in prompts:
        ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        same_ids &= gguf_tokenizer(prompt, add_special_tokens=True)["input_ids"] == ids
        batch = torch.tensor([ids], device=model.device)
        with torch.no_grad():
            expected = model(input_ids=batch).logits.float().cpu()
            got = gguf_model(input_ids=batch.cpu()).logits.float()
        largest = max(largest, (expected - got).abs().max().item())
        scale = max(scale, expected.abs().max().item())
        same_next += int(expected[0, -1].argmax() == got[0, -1].argmax())
    return ReaderCheck(len(prompts), same_ids, largest, scale, same_next, LOGIT_TOLERANCE[quant])
