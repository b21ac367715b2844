"""``memory.chunked_loss``: the causal LM's loss through torch's chunked linear cross-entropy.

Hugging Face's ``ForCausalLMLoss`` builds the tokens x vocabulary logits, upcasts them to fp32 and keeps its
log-softmax for backward: 12 bytes per token and vocabulary entry at the start of backward, the largest
single buffer at long context.  ``torch.nn.functional.linear_cross_entropy`` with
``LinearCrossEntropyOptions`` (torch 2.13) runs the output head and the cross-entropy over chunks of tokens,
each chunk's logits about the size of the hidden states, and computes the gradients inside the forward, so the
full logits never exist.  The model's own forward still runs (decoder, hooks, DDP/DeepSpeed wrappers, PEFT); its
output head is asked for one position only and the loss is computed from the decoder's last hidden state.
The loss is normalised as ``ForCausalLMLoss`` does: summed and divided by the Trainer's ``num_items_in_batch``
when given (gradient accumulation), else the mean over the tokens that have a label.
"""
from __future__ import annotations

from types import MethodType

IGNORE_INDEX = -100  # the label of tokens without a loss (prompt, padding), as in transformers


def chunked_causal_lm_loss(hidden, head, labels, num_items_in_batch=None):
    """The next-token cross-entropy of ``hidden`` (batch, seq, hidden) through the linear ``head``, in chunks."""
    import torch
    from torch.nn import LinearCrossEntropyOptions
    from torch.nn.functional import linear_cross_entropy

    shifted = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]  # position t predicts t + 1
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight, shifted.reshape(-1).to(hidden.device),
                                linear_bias=head.bias, reduction=reduction, ignore_index=IGNORE_INDEX,
                                options=LinearCrossEntropyOptions())
    if num_items_in_batch is not None:
        loss = loss / torch.as_tensor(num_items_in_batch, device=loss.device)
    return loss


def enable_chunked_loss(model) -> None:
    """Route the loss of ``model`` (a causal LM, or a PEFT model around one) through :func:`chunked_causal_lm_loss`."""
    from tuner.loading.model import ModelLoadError

    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(causal_lm.config, "final_logit_softcapping", None):
        raise ModelLoadError(f"memory.chunked_loss: {causal_lm.config.model_type} soft-caps its logits, which the chunked "
                         "loss cannot do; set chunked_loss: false.")
    decoder, head, original = causal_lm.get_decoder(), causal_lm.get_output_embeddings(), causal_lm.forward

    def forward(self, *args, labels=None, num_items_in_batch=None, **kwargs):
        if labels is None:
            return original(*args, **kwargs)
        captured = []
        hook = decoder.register_forward_hook(lambda module, inputs, output: captured.append(output.last_hidden_state))
        try:
            outputs = original(*args, logits_to_keep=1, **kwargs)  # the head on the last position only
        finally:
            hook.remove()
        outputs.loss = chunked_causal_lm_loss(captured[-1], head, labels, num_items_in_batch)
        outputs.logits = None  # one position's logits would mislead; the Trainer evaluates the loss only
        return outputs

    causal_lm.forward = MethodType(forward, causal_lm)
