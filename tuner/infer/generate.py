"""Batched generation from plain prompts (left padding, so every prompt ends where generation starts)."""
from __future__ import annotations


def generate_answers(model, tokenizer, prompts: list[str], max_new_tokens: int, greedy: bool = True,
                     temperature: float = 1.0, top_p: float = 1.0, batch_size: int = 64) -> list[str]:
    import torch

    tokenizer.padding_side = "left"
    answers: list[str] = []
    model.eval()
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start:start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False).to(model.device)
        sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": temperature, "top_p": top_p}
        with torch.no_grad():
            output = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                    **sampling)
        new_tokens = output[:, batch["input_ids"].shape[1]:]
        answers += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    return answers
