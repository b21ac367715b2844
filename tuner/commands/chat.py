"""``tuner chat TARGET``: an interactive conversation that streams tokens as they are generated.

A line ending in a backslash continues the message on the next line; /reset forgets the conversation,
/exit (or end of input, Ctrl-D) quits; Ctrl-C stops the answer being written (with ``--tp N`` or ``--pp N``, it ends the chat
on every rank: rank 0 reads the terminal and sends each message's generate call to the other ranks).
"""
from __future__ import annotations

import sys

from tuner.commands._inference_args import (add_inference_arguments, load_from_args, prompt_format_from_args,
                                            run_on_ranks)
from tuner.commands._types import not_utf8, utf8_text

EXIT_SKIPPED = 2  # a piped conversation had messages that could not be sent

HELP = ("end a line with \\ to continue the message; /image PATH attaches a picture to the next message (image-text "
        "models); /reset forgets the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer")
# the ranks run in their own sessions: the terminal's Ctrl-C reaches tuner, which stops every rank
HELP_RANKS = HELP.replace("Ctrl-C stops an answer", "Ctrl-C ends the chat on every rank")


def register(subparsers) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model, a recipe's model or a trained run (streams tokens)")
    add_inference_arguments(parser)
    parser.add_argument("--system", metavar="TEXT", type=utf8_text, help="system prompt at the start of the conversation")
    parser.set_defaults(run=run)


def _read(interactive: bool) -> str | None:
    """One message; a line ending in a backslash continues on the next line (the message keeps the newline)."""
    lines: list[str] = []
    try:
        while True:
            line = input(("... " if lines else "you> ") if interactive else "")
            if not line.endswith("\\"):
                return "\n".join(lines + [line])
            lines.append(line[:-1])
    except EOFError:
        return "\n".join(lines) if lines else None


def run(args) -> int:
    return run_on_ranks(args, _chat)


def _chat(args) -> int:
    from tuner.infer.chat import ChatSession
    from tuner.infer.generate import GENERATION_FAILURES, PromptTooLong
    from tuner.loading.model import ModelLoadError

    loaded, sampling = load_from_args(args)
    prompt = prompt_format_from_args(args, loaded)
    session = ChatSession(loaded.model, loaded.tokenizer, sampling, prompt.data_format, args.system, prompt.instruction,
                          loaded.processor)
    interactive = sys.stdin.isatty()
    sys.stdin.reconfigure(errors="surrogateescape")  # a byte that is not UTF-8 fails its message, not the session
    print(HELP if args.tp == args.pp == 1 else HELP_RANKS, file=sys.stderr)
    number = skipped = 0
    while True:
        message = _read(interactive)
        if message is None or message.strip() == "/exit":
            if interactive:
                print()
            return EXIT_SKIPPED if skipped and not interactive else 0
        if message.strip() == "/reset":
            session.reset()
            print("(conversation cleared)", file=sys.stderr)
            continue
        if message.strip().startswith("/image"):
            _attach(session, message.strip().removeprefix("/image").strip(), loaded.target.recipe.data.max_image_pixels)
            continue
        if not message.strip():
            continue
        number += 1
        problem = not_utf8(message)
        if problem:
            skipped += 1
            print(f"message {number} is {problem}; not sent", file=sys.stderr)
            continue
        answer = session.send(message)
        try:
            for chunk in answer:
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except (PromptTooLong, ModelLoadError) as exc:  # too long, or the chat template fails on it
            skipped += 1
            print(f"message {number}: {exc}; not sent", file=sys.stderr)
            continue
        except GENERATION_FAILURES as exc:
            skipped += 1
            print(f"\nmessage {number}: generation failed ({type(exc).__name__}: {exc}); this turn is not kept",
                  file=sys.stderr)
            continue
        except KeyboardInterrupt:
            answer.close()
            print("\n(stopped; this turn is not kept)", file=sys.stderr)
            print()
            continue
        print()
        print(f"({session.last_speed.line()})", file=sys.stderr)


def _attach(session, path: str, max_pixels: int) -> None:
    """``/image PATH``: the picture read within the bounds and attached to the next message, or why not."""
    from tuner.infer.images import image_file

    try:
        if not path:
            raise ValueError("/image needs a path: /image PATH")
        image = image_file(path, max_pixels)
        session.attach(image)
    except ValueError as exc:
        print(f"{str(exc).replace('--image: ', '/image: ', 1)}; nothing attached", file=sys.stderr)
        return
    print(f"(image {image.width}x{image.height} attached to the next message)", file=sys.stderr)
