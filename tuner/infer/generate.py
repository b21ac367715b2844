"""Batched generation from plain prompts (left padding, so every prompt ends where generation starts),
the sampling settings, and how a conversation becomes prompt text."""
from __future__ import annotations

import time
from dataclasses import dataclass

from tuner.data.formats import chat_template_for
from tuner.loading.model import ModelLoadError


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens: the recipe's inference section, each value overridable (None keeps the recipe's)."""

    max_new_tokens: int
    greedy: bool
    temperature: float
    top_p: float

    @classmethod
    def from_recipe(cls, recipe, max_new_tokens: int | None = None, greedy: bool | None = None,
                    temperature: float | None = None, top_p: float | None = None) -> "Sampling":
        inference = recipe.inference
        return cls(
            max_new_tokens=inference.max_new_tokens if max_new_tokens is None else max_new_tokens,
            greedy=inference.greedy if greedy is None else greedy,
            temperature=inference.temperature if temperature is None else temperature,
            top_p=inference.top_p if top_p is None else top_p,
        )


# what generate raises for a batch it cannot answer (torch's out-of-memory is a RuntimeError; a damaged model's or
# generation config's settings end in any of the others deep inside): reported with the prompt, never a traceback
GENERATION_FAILURES = (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError)

# the config fields transformers' model families name their longest sequence with
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
UNBOUNDED = 10**9  # a tokenizer's model_max_length this large means "not set"


class PromptTooLong(ValueError):
    """A prompt and its answer would not fit the model's context; ``str()`` names the sizes and what to do."""


def model_context(model, tokenizer) -> int | None:
    """The longest sequence (prompt and answer) the model was built for: its config's position limit, else the
    tokenizer's ``model_max_length``; None when neither says."""
    config = getattr(model, "config", None)
    for source in (getattr(config, "get_text_config", lambda: config)(), config):
        for name in CONTEXT_FIELDS:
            value = getattr(source, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < UNBOUNDED else None


def context_problem(prompt_tokens: int, max_new_tokens: int, context: int | None) -> str | None:
    """Why a prompt of ``prompt_tokens`` with an answer of up to ``max_new_tokens`` cannot be asked (None: it can)."""
    if context is None or prompt_tokens + max_new_tokens <= context:
        return None
    if max_new_tokens >= context:
        return (f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's context of {context} "
                f"tokens; lower --max-new-tokens (inference.max_new_tokens) below {context}")
    return (f"the prompt is {prompt_tokens} tokens and its answer may take {max_new_tokens} (max_new_tokens): more "
            f"than the model's context of {context} tokens; shorten it to at most {context - max_new_tokens} tokens, "
            "or lower --max-new-tokens")


def check_prompt_fits(tokenizer, model, prompt: str, max_new_tokens: int) -> None:
    """Raise :class:`PromptTooLong` for a prompt (rendered text) that does not fit the model's context."""
    tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    problem = context_problem(tokens, max_new_tokens, model_context(model, tokenizer))
    if problem:
        raise PromptTooLong(problem)


@dataclass
class Speed:
    """Tokens generated and the seconds ``generate`` took for them (summed over batches), as printed on stderr."""

    tokens: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        rate = self.tokens / self.seconds if self.seconds else 0.0
        return f"{self.tokens} tokens in {self.seconds:.2f} s: {rate:.1f} tokens/s"


def generation_kwargs(tokenizer, max_new_tokens: int, greedy: bool = True, temperature: float = 1.0,
                      top_p: float = 1.0) -> dict:
    """Arguments for ``model.generate`` (sampling knobs only when sampling, so transformers does not warn)."""
    sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": temperature, "top_p": top_p}
    return {"max_new_tokens": max_new_tokens, "pad_token_id": tokenizer.pad_token_id, **sampling}


def execution_device(model):
    """Where inputs go: the first GPU of a dispatched model, else the CPU (offloaded weights sit on 'meta')."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return model.device
    gpus = sorted(device for device in device_map.values() if isinstance(device, int))
    return f"cuda:{gpus[0]}" if gpus else "cpu"


def render_prompt(tokenizer, messages: list[dict[str, str]], data_format: str = "auto") -> str:
    """The text that asks the model to answer the last user turn, formatted as tuner trains
    (:func:`tuner.data.formats.chat_template_for`: the same template ``tuner serve`` hands the server; an
    instruction turn's first line is the instruction, the rest its input, as :func:`user_turn` joins them)."""
    from tuner.data.chat_template import TemplateRefused, render_chat

    try:
        return render_chat(tokenizer, messages, chat_template_for(tokenizer, data_format), add_generation_prompt=True)
    except TemplateRefused as exc:  # past a bound, or the template's own code failing on this conversation
        raise ModelLoadError(str(exc)) from None


def user_turn(message: str, instruction: str | None) -> str:
    """A message as the user turn of an instruction-trained run: its instruction, then the message as the
    input, joined as training joins them (a message that already starts with the instruction is kept)."""
    if not instruction or message.split("\n", 1)[0] == instruction:
        return message
    return f"{instruction}\n{message}"


def generate_answers(model, tokenizer, prompts: list[str], max_new_tokens: int, greedy: bool = True,
                     temperature: float = 1.0, top_p: float = 1.0, batch_size: int = 64,
                     speed: Speed | None = None) -> list[str]:
    """The answers to ``prompts``, in order; ``speed`` (when given) adds the tokens generated and the time taken."""
    import torch

    tokenizer.padding_side = "left"
    answers: list[str] = []
    model.eval()
    settings = generation_kwargs(tokenizer, max_new_tokens, greedy, temperature, top_p)
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start:start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False).to(execution_device(model))
        start = time.perf_counter()
        with torch.no_grad():
            output = model.generate(**batch, **settings)
        new_tokens = output[:, batch["input_ids"].shape[1]:]
        if speed is not None:
            speed.seconds += time.perf_counter() - start
            speed.tokens += int((new_tokens != tokenizer.pad_token_id).sum())  # the padding after an early end
        answers += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    return answers
