"""The loss path alone on a GPU: what the caching allocator reserves beyond the live T x V buffers.

    python -m benchmarks.allocator_probe      # one NVIDIA GPU, about 10 s

A frozen 16-bit output head and Hugging Face's causal-LM loss (fp32 upcast, cross-entropy), forward and
backward twice, for three (tokens, vocabulary) shapes. Prints the allocated peak in units of T x V bytes
(the planner's logits and loss item counts 12) and reserved minus allocated (its allocator term counts 4).
Measured on an H200 (2026-11-30): 12.05 / 11.95 / 12.00 TV allocated; 5.97 / 3.06 / 3.64 TV more reserved.
"""
from __future__ import annotations

GIB = 2**30
SHAPES = ((8192, 151936, 896), (2048, 151936, 896), (8192, 128256, 4096))  # tokens, vocabulary, hidden


def main() -> None:
    import torch
    import torch.nn.functional as F

    for tokens, vocab, hidden in SHAPES:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        head = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16)
        states = torch.randn(1, tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, vocab, (1, tokens), device="cuda")
        before = torch.cuda.memory_allocated()
        for _ in range(2):
            logits = states @ head.t()  # kept through the loss forward, as the model's output is
            upcast = logits.float()
            shifted = F.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1)
            loss = F.cross_entropy(upcast.view(-1, vocab), shifted, ignore_index=-100)
            del logits, upcast
            loss.backward()
            states.grad = None
        allocated = (torch.cuda.max_memory_allocated() - before) / GIB
        extra = (torch.cuda.max_memory_reserved() - before) / GIB - allocated
        tv = tokens * vocab / GIB
        print(f"T={tokens} V={vocab}: allocated {allocated:.2f} GiB = {allocated / tv:.2f} TV; "
              f"reserved beyond it {extra:.2f} GiB = {extra / tv:.2f} TV")
        del head, states, labels


if __name__ == "__main__":
    main()
