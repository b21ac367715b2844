"""``tuner data preview RECIPE [--set k=v] [-n N]``: show formatted, tokenised samples with the masked part marked."""
from __future__ import annotations

from tuner.commands._recipe_args import add_recipe_arguments, recipe_from_args
from tuner.commands._types import at_least


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help="inspect a recipe's training data")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    preview = actions.add_parser("preview", help="print a few samples as the model is trained on them: "
                                                 "learned tokens bold, masked (no loss) tokens dim")
    add_recipe_arguments(preview)
    preview.add_argument("-n", "--count", type=at_least(1), default=3, help="how many samples (default 3)")
    preview.set_defaults(run=run_preview)


def run_preview(args) -> int:
    from rich.console import Console
    from rich.text import Text

    from tuner.data.preview import preview_examples
    from tuner.loading.model import is_image_text, load_processor, load_tokenizer, resolve_model_path, source_config

    recipe = recipe_from_args(args)
    image_text = is_image_text(source_config(recipe, resolve_model_path(recipe.model.id)))
    processor = load_processor(recipe) if image_text else None
    tokenizer = processor.tokenizer if processor else load_tokenizer(recipe)
    data_format, examples = preview_examples(recipe, tokenizer, args.count, processor)
    console = Console(highlight=False)
    plain = not console.is_terminal  # no styles in a pipe or a log: masked text goes between « »
    legend = "masked text between « »" if plain else "[bold]bold[/] = learned, [dim]dim[/] = masked"
    masking = "loss on every token" if recipe.data.train_on_prompt or data_format == "text" else "loss on completions only"
    if recipe.objective.preference:
        masking = f"{recipe.objective.kind}: each answer after its masked prompt"
    if recipe.objective.kind == "reward":
        masking = "reward: prompt + chosen and prompt + rejected, each scored whole by the head (bold: the answers)"
    grpo = recipe.objective.grpo
    if grpo is not None:
        masking = (f"grpo: {grpo.num_generations} completions of up to {grpo.max_completion_length} tokens are sampled "
                   "after each prompt and scored by the rewards")
    console.print(f"format: {data_format} ({masking}; {legend}), max_seq_length {recipe.training.max_seq_length}")
    for index, example in enumerate(examples, 1):
        cut = ", truncated" if example.truncated else ""
        if grpo is not None:
            cut = f", longer than max_prompt_length {grpo.max_prompt_length}: dropped" if example.truncated else ""
        answer = f" ({example.answer})" if example.answer else ""
        size = (f"a prompt of {example.tokens} tokens" if grpo is not None else
                f"{example.tokens} tokens, {example.trainable_tokens} learned")
        console.rule(f"sample {example.row or index}{answer}: {size}{cut}")
        text = Text()
        for segment, trainable in example.segments:
            if plain and not trainable:
                segment = f"«{segment}»"
            text.append(segment, style="bold" if trainable else "dim")
        console.print(text)
        if example.reward_inputs is not None:
            inputs = ", ".join(f"{key}={value!r}" for key, value in example.reward_inputs.items()) or "none"
            console.print(f"reward inputs: {inputs}", markup=False)
    return 0
