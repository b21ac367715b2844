"""A conversation with a loaded model that streams its answers.

:class:`ChatSession` does no terminal I/O: ``send(message)`` yields text chunks as tokens are generated,
so ``tuner chat`` prints them and the TUI can append them to a widget from a worker thread.
History goes through the same prompt rendering as ``tuner infer`` (the chat template when there is one).
"""
from __future__ import annotations

import threading
import time
from typing import Iterator

from tuner.infer.generate import (
    PromptTooLong,
    Sampling,
    Speed,
    context_problem,
    execution_device,
    generation_kwargs,
    model_context,
    render_prompt,
    user_turn,
)


class ChatSession:
    """History plus generation settings; one answer at a time."""

    def __init__(self, model, tokenizer, sampling: Sampling, data_format: str = "chat", system: str | None = None,
                 instruction: str | None = None, processor=None):
        self.model = model
        self.processor = processor  # an image-text model's: /image attaches pictures to the next message
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.data_format = data_format
        self.system = system
        self.instruction = instruction  # an instruction-trained run's shared instruction: messages are its input
        self.history: list[dict[str, str]] = []
        self.last_speed = Speed()  # of the last finished answer
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.history = [{"role": "system", "content": self.system}] if self.system else []
        self.images: list = []  # every picture of the conversation, in the order its placeholders take them
        self.pending: list = []  # attached to the next message

    def attach(self, image) -> None:
        """Attach a picture (PIL, opened within the bounds) to the next message; refused for a text-only model."""
        if self.processor is None:
            raise ValueError("this model reads text only (it has no image processor); /image needs an image-text "
                             "model")
        self.pending.append(image)

    def _turn(self, message: str) -> dict:
        if self.processor is None:
            return {"role": "user", "content": user_turn(message, self.instruction)}
        from tuner.infer.images import user_turn as image_turn

        return image_turn(message, len(self.pending))

    def _inputs(self, message: str) -> dict:
        """The model's inputs to answer ``message`` after the history: token ids (and, with images, the processor's
        pixel values)."""
        if self.processor is None:
            ids = self.prompt_ids(message)
            return {"input_ids": [ids]}
        messages = self.history + [self._turn(message)]
        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        images = self.images + self.pending
        return dict(self.processor(text=[text], images=[images] if images else None, return_tensors="pt",
                                   add_special_tokens=False))

    @property
    def single_turn(self) -> bool:
        """An instruction-trained run saw one instruction and its answer at a time, never a conversation:
        each message is asked on its own (the history is kept for the user, not sent)."""
        return self.data_format == "instruction"

    def prompt_ids(self, message: str) -> list[int]:
        """The token ids the model is given to answer ``message`` after the history so far."""
        earlier = [] if self.single_turn else self.history
        messages = earlier + [{"role": "user", "content": user_turn(message, self.instruction)}]
        text = render_prompt(self.tokenizer, messages, self.data_format)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def send(self, message: str) -> Iterator[str]:
        """Yield the answer to ``message`` in chunks as it is generated; the finished turn joins the history.

        Closing the iterator early (the user cancelled) stops generation and leaves the history unchanged; a message
        that with the conversation so far would not fit the model's context raises :class:`PromptTooLong` (nothing
        is generated, the history is unchanged).
        """
        import torch
        from transformers import StoppingCriteria, TextIteratorStreamer

        class _Cancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool, device=input_ids.device)

        given = self._inputs(message)
        first = given["input_ids"][0]
        ids = first.tolist() if hasattr(first, "tolist") else list(first)
        problem = context_problem(len(ids), self.sampling.max_new_tokens, model_context(self.model, self.tokenizer))
        if problem:
            raise PromptTooLong(problem + ("" if self.single_turn or len(self.history) < 2 else "; /reset starts over"))
        device = execution_device(self.model)
        inputs = torch.tensor([ids], device=device)
        extra = {key: value.to(device) for key, value in given.items() if key not in ("input_ids", "attention_mask")}
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        cancel = threading.Event()
        outcome: dict = {}
        settings = generation_kwargs(self.tokenizer, **vars(self.sampling))

        def generate() -> None:
            try:
                with torch.no_grad():
                    outcome["ids"] = self.model.generate(
                        input_ids=inputs, attention_mask=torch.ones_like(inputs), streamer=streamer,
                        stopping_criteria=[_Cancelled()], **extra, **settings)
            except BaseException as exc:  # handed to the consuming thread below
                outcome["error"] = exc
                streamer.end()

        worker = threading.Thread(target=generate, name="tuner-chat-generate", daemon=True)
        start = time.perf_counter()
        worker.start()
        try:
            for chunk in streamer:
                if chunk:
                    yield chunk
        finally:
            cancel.set()
            worker.join()
        if "error" in outcome:
            raise outcome["error"]
        self.last_speed = Speed(outcome["ids"].shape[1] - len(ids), time.perf_counter() - start)
        answer = self.tokenizer.decode(outcome["ids"][0, len(ids):], skip_special_tokens=True)
        self.history += [self._turn(message), {"role": "assistant", "content": answer}]
        self.images, self.pending = self.images + self.pending, []
