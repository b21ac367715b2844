"""``tuner infer TARGET --prompt TEXT`` (one answer) or ``--input prompts.jsonl --output answers.jsonl`` (a batch).

TARGET is a recipe, a run directory or ``--model``; the model is placed with device_map="auto" (or split over
``--tp N`` ranks, or over ``--pp N`` pipeline stages) and the placement is printed to stderr before generating, so
stdout carries only the answer.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tuner.commands._inference_args import (add_inference_arguments, load_from_args, prompt_format_from_args,
                                            run_on_ranks)
from tuner.commands._types import at_least, utf8_text
from tuner.reason import library_words

EXIT_BAD_LINES = 2


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "infer",
        help="answer one prompt or a JSONL file of prompts (device_map=auto placement, --tp N ranks or --pp N stages)")
    add_inference_arguments(parser)
    what = parser.add_argument_group("prompts")
    what.add_argument("--prompt", metavar="TEXT", type=utf8_text, help="one prompt (a user turn); the answer goes to stdout")
    what.add_argument("--image", metavar="PATH", action="append", default=[],
                      help="an image the prompt is about (an image-text model; repeat for several, in order); read "
                           "within data.max_image_pixels")
    what.add_argument("--input", metavar="FILE", help='JSON lines, each {"prompt": ...} or {"messages": [...]}')
    what.add_argument("--output", metavar="FILE", help="JSON lines answers, one per input line, in input order")
    what.add_argument("--batch-size", type=at_least(1), default=8, metavar="N", help="prompts generated together (default 8)")
    what.add_argument("--force", action="store_true",
                      help="overwrite --output when it holds answers tuner wrote (never the --input file)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from tuner.data.sources import DataError
    from tuner.infer.batch import check_output

    if (args.prompt is None) == (args.input is None):
        raise DataError("give either --prompt TEXT or --input FILE --output FILE.")
    if args.image and args.input is not None:
        raise DataError("--image goes with --prompt; a batch names its images in the --input lines' messages.")
    if args.input is None:
        return run_on_ranks(args, _run_one)
    if args.output is None:
        raise DataError("--input needs --output FILE for the answers.")
    check_output(Path(args.output), Path(args.input), args.force)
    return run_on_ranks(args, _run_batch)


def _run_one(args) -> int:
    from tuner.data.sources import DataError
    from tuner.infer.generate import (
        GENERATION_FAILURES,
        PromptTooLong,
        Speed,
        check_prompt_fits,
        generate_answers,
        render_prompt,
        user_turn,
    )
    from tuner.loading.model import ModelLoadError

    loaded, sampling = load_from_args(args)
    if args.image or loaded.processor is not None:
        return _answer_images(args, loaded, sampling)
    found = prompt_format_from_args(args, loaded)
    messages = [{"role": "user", "content": user_turn(args.prompt, found.instruction)}]
    prompt = render_prompt(loaded.tokenizer, messages, found.data_format)
    try:
        check_prompt_fits(loaded.tokenizer, loaded.model, prompt, sampling.max_new_tokens)
    except PromptTooLong as exc:
        raise DataError(f"--prompt: {exc}.") from None
    speed = Speed()
    try:
        answer = generate_answers(loaded.model, loaded.tokenizer, [prompt], speed=speed, **vars(sampling))[0]
    except GENERATION_FAILURES as exc:
        raise ModelLoadError(f"{loaded.target.describe()}: generation failed ({type(exc).__name__}: "
                             f"{library_words(exc)}); the model's files may not match each other.") from None
    print(answer)
    print(speed.line(), file=sys.stderr)
    return 0


def _answer_images(args, loaded, sampling) -> int:
    """One answer of an image-text model to --prompt and its --image files (none: a text-only question)."""
    from tuner.data.sources import DataError
    from tuner.infer.images import image_answers, image_file, user_turn

    if loaded.processor is None:
        raise DataError(f"--image: {loaded.target.describe()} is a text-only model (it has no image processor); "
                        "give an image-text model, or leave --image out.")
    try:
        images = [image_file(path, loaded.target.recipe.data.max_image_pixels) for path in args.image]
    except ValueError as exc:
        raise DataError(str(exc)) from None
    conversation = ([user_turn(args.prompt, len(images))], images)
    print(image_answers(loaded.model, loaded.processor, [conversation], **vars(sampling))[0])
    return 0


def _run_batch(args) -> int:
    from tuner.infer.batch import BadLine, read_prompt_file, write_answers
    from tuner.infer.generate import Speed, context_problem, generate_answers, model_context, render_prompt
    from tuner.loading.model import ModelLoadError

    prompts, bad = read_prompt_file(args.input)

    def report(line: BadLine) -> None:
        print(f"warning: {line.message(args.input)}", file=sys.stderr)

    for line in bad:
        report(line)
    speed = Speed()
    texts: dict[int, str] = {}
    loaded = sampling = None
    if prompts:
        loaded, sampling = load_from_args(args, batch=min(args.batch_size, len(prompts)))
        found = prompt_format_from_args(args, loaded)
        context = model_context(loaded.model, loaded.tokenizer)
        for prompt in list(prompts):  # a prompt the context cannot hold is refused alone, before generating
            try:
                text = render_prompt(loaded.tokenizer, as_trained(prompt, found.instruction), found.data_format)
            except ModelLoadError as exc:  # the chat template fails on this conversation alone
                text, problem = None, str(exc).rstrip(".")
            else:
                tokens = len(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])
                problem = context_problem(tokens, sampling.max_new_tokens, context)
            if problem:
                prompts.remove(prompt)
                bad.append(BadLine(prompt.line, f"{problem}."))
                report(bad[-1])
            else:
                texts[prompt.line] = text

    def answer_batch(batch) -> list[str]:
        return generate_answers(loaded.model, loaded.tokenizer, [texts[p.line] for p in batch], batch_size=len(batch),
                                speed=speed, **vars(sampling))

    failed: list[BadLine] = []
    answered = write_answers(args.output, sorted([*prompts, *bad], key=lambda item: item.line), answer_batch,
                             args.batch_size, on_bad=lambda line: (failed.append(line), report(line)))
    if prompts:
        print(speed.line(), file=sys.stderr)
    unanswered = len(bad) + len(failed)
    skipped = f"; {unanswered} line(s) not answered, see above" if unanswered else ""
    print(f"wrote {answered} answer(s) to {args.output}{skipped}", file=sys.stderr)
    return EXIT_BAD_LINES if unanswered else 0


def as_trained(prompt, instruction: str | None) -> list[dict[str, str]]:
    """A {"prompt": ...} line is a message for the run's instruction; {"messages": [...]} are sent as given."""
    from tuner.infer.generate import user_turn

    if "prompt" not in prompt.record:
        return prompt.messages
    return [{"role": "user", "content": user_turn(prompt.messages[-1]["content"], instruction)}]
