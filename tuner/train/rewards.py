"""The reward functions of a grpo run: the built-ins, a user's function, a reward model; each checked on every call.

TRL calls every reward function on every rank with the rank's completions, as ``fn(prompts=, completions=,
completion_ids=, **columns)``, and expects one number (or None: not applicable) per completion.  Each function here
is wrapped in :class:`CheckedReward`: a reward that raises, returns the wrong number of values or something that is
not a number stops the run with :class:`RewardError`, naming the reward and the prompt's row in the data; the ranks
agree on it first (one all-gather per reward and generation round), so every rank stops at the same point instead
of the others waiting in the next collective.  A call that does not return within ``objective.grpo.
reward_time_limit_s`` stops the run the same way: the function runs in a thread of its own that the rank waits for
at most that long (a thread cannot be killed; the rank leaves with ``os._exit``, which ends it).

A user reward (``function: path/to/file.py:name``) is imported here, on every rank, and only here: the recipe names
it, so running it is what the recipe asks for.
"""
from __future__ import annotations

import importlib.util
import math
import re
import threading
from typing import Any, Callable

from tuner.data.prompts import ROW_COLUMN
from tuner.recipe.objective import RewardSection
from tuner.recipe.rewards import reward_names, split_function
from tuner.recipe.schema import Recipe
from tuner.reason import library_words

TRL_CONTEXT = ("trainer_state", "log_extra", "log_metric", "environments")  # what TRL adds beside the columns


class RewardError(Exception):
    """A reward failed on a prompt; the message names both (exit code 2, on every rank)."""


class RewardTimeout(Exception):
    """A reward call ran past its time limit (still running, in its abandoned thread)."""


def call_within(limit_s: float, function: Callable, *args, **kwargs):
    """``function(*args, **kwargs)`` in a daemon thread, its result or its exception; :class:`RewardTimeout` when it
    has not returned after ``limit_s``.  The thread gets the caller's grad mode and CUDA device, thread-local state
    a reward may rely on."""
    import torch

    grad = torch.is_grad_enabled()
    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    outcome: dict[str, Any] = {}

    def target():
        if device is not None:
            torch.cuda.set_device(device)
        try:
            with torch.set_grad_enabled(grad):
                outcome["value"] = function(*args, **kwargs)
        except BaseException as exc:  # handed to the caller, as a direct call would raise it
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="tuner-reward", daemon=True)
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        raise RewardTimeout
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def completion_text(completion) -> str:
    """A completion as text: TRL hands conversational completions as [{"role": "assistant", "content": ...}]."""
    if isinstance(completion, list):
        return "".join(message.get("content") or "" for message in completion if isinstance(message, dict))
    return completion


def _expected(value: Any, column: str) -> str:
    if value is None:
        raise ValueError(f"the column {column!r} is empty for this prompt")
    return str(value).strip()


def builtin_reward(reward: RewardSection, max_completion_length: int) -> Callable:
    """The function of a built-in reward kind (exact_match, regex_match, format, length, math, think_format)."""
    column = reward.column
    compiled = re.compile(reward.pattern) if reward.pattern else None

    def exact_match(completions, **columns):
        return [float(completion_text(c).strip() == _expected(v, column)) for c, v in zip(completions, columns[column])]

    def regex_match(completions, **columns):
        scores = []
        for completion, value in zip(completions, columns[column]):
            found = compiled.search(completion_text(completion))
            answer = (found.group(1) if compiled.groups else found.group(0)) if found else None
            scores.append(float(answer is not None and answer.strip() == _expected(value, column)))
        return scores

    def format_check(completions, **_):
        return [float(compiled.fullmatch(completion_text(c)) is not None) for c in completions]

    def length(completion_ids, **_):
        allowed = reward.target_tokens or 0
        return [-max(0, len(ids) - allowed) / max_completion_length for ids in completion_ids]

    def as_messages(completions) -> list:  # TRL's reward functions read completion[0]["content"]
        return [[{"role": "assistant", "content": completion_text(c)}] for c in completions]

    def math(completions, **columns):  # None where the solution does not parse: TRL leaves the completion out
        from trl.rewards import accuracy_reward

        return accuracy_reward(as_messages(completions), [_expected(v, column) for v in columns[column]])

    def think_format(completions, **_):
        from trl.rewards import think_format_reward

        return think_format_reward(as_messages(completions))

    return {"exact_match": exact_match, "regex_match": regex_match, "format": format_check,
            "length": length, "math": math, "think_format": think_format}[reward.kind]


def math_checker_problem() -> str | None:
    """Why a math reward cannot run here: TRL's checker needs the math-verify package."""
    if importlib.util.find_spec("math_verify") is None:
        return ("a math reward checks answers with TRL's accuracy_reward, which needs the math-verify package: "
                "pip install 'math-verify[antlr4_13_2]' on every machine, or use another reward kind")
    return None


def user_reward(spec: str) -> Callable:
    """The user's function named ``path/to/file.py:name``, imported from its file (the recipe names it)."""
    path, name = split_function(spec)
    module_name = f"tuner_user_reward_{abs(hash(path))}"
    try:
        loader = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    except Exception as exc:
        raise RewardError(f"objective.grpo.rewards: importing {path} failed: {type(exc).__name__}: {library_words(exc)}; fix the "
                          "file and run again.") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise RewardError(f"objective.grpo.rewards: {path} has no function {name!r}.")
    return function


def _number_problem(value: Any) -> str | None:
    if value is None or (isinstance(value, (int, float)) and math.isfinite(value)):
        return None
    if isinstance(value, (int, float)):
        return f"returned {value}, not a finite number"
    return f"returned {type(value).__name__} {str(value)[:40]!r}, not a number"


def _shown(prompt) -> str:
    text = completion_text(prompt) if isinstance(prompt, list) else str(prompt)
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _agreed(problem: str | None) -> str | None:
    """The first rank's problem, if any rank has one (every rank calls this at the same point)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return problem
    everyone: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, problem)
    return next((found for found in everyone if found), None)


class CheckedReward:
    """A reward function TRL can call, whose failures stop the run naming the reward and the prompt."""

    def __init__(self, function: Callable, name: str, index: int, source: str, user: bool, time_limit_s: float):
        self.function, self.index, self.source, self.user = function, index, source, user
        self.time_limit_s = time_limit_s
        self.__name__ = name  # TRL logs each reward under its function's name

    def _call(self, prompts, completions, completion_ids, columns) -> list:
        context = columns if self.user else {k: v for k, v in columns.items() if k not in TRL_CONTEXT}
        return call_within(self.time_limit_s, lambda: list(self.function(
            prompts=prompts, completions=completions, completion_ids=completion_ids, **context)))

    def _first_failing(self, prompts, completions, completion_ids, columns) -> int:
        """Which completion a raising reward fails on: each one alone, until one raises (only on the failure path)."""
        for i in range(len(completions)):
            one = {k: v[i:i + 1] if isinstance(v, list) and len(v) == len(completions) else v for k, v in columns.items()}
            try:
                self._call(prompts[i:i + 1], completions[i:i + 1], completion_ids[i:i + 1], one)
            except (Exception, SystemExit, RewardTimeout):
                return i
        return 0

    def __call__(self, prompts, completions, completion_ids, **columns):
        rows = columns.pop(ROW_COLUMN, None) or [None] * len(completions)
        problem, at, values = None, 0, None
        fix = f"fix the reward{' function' if self.user else ' or the data'}"
        try:
            values = self._call(prompts, completions, completion_ids, columns)
        except RewardTimeout:
            problem = (f"did not return within {self.time_limit_s:g} s (objective.grpo.reward_time_limit_s) scoring "
                       f"{len(completions)} completions, the first")
            fix = "make it faster or raise objective.grpo.reward_time_limit_s"
        except (Exception, SystemExit) as exc:  # sys.exit() in a reward must not end the rank unexplained
            at = self._first_failing(prompts, completions, completion_ids, columns)
            problem = f"raised {type(exc).__name__}: {library_words(exc)}"
        if values is not None and len(values) != len(completions):
            problem = f"returned {len(values)} values for {len(completions)} completions (one per completion is due)"
        elif values is not None:
            at, problem = next(((i, found) for i, value in enumerate(values) if (found := _number_problem(value))),
                               (0, None))
        if problem:
            row = f"row {rows[at]} of {self.source}" if rows[at] is not None else f"a prompt of {self.source}"
            problem = (f"objective.grpo.rewards.{self.index}: the reward {self.__name__!r} {problem} on a completion "
                       f"of prompt {row} ({_shown(prompts[at])!r}); {fix} and run again.")
        agreed = _agreed(problem)
        if agreed:
            raise RewardError(agreed)
        return [float("nan") if value is None else float(value) for value in values]


def reward_functions(recipe: Recipe) -> tuple[list, list]:
    """(what TRL calls for each reward, in the recipe's order; the tokenizer of each reward model, else None)."""
    grpo = recipe.objective.grpo
    functions, tokenizers = [], []
    for index, (reward, name) in enumerate(zip(grpo.rewards, reward_names(grpo.rewards))):
        if reward.kind == "model":
            model, tokenizer = load_reward_model(recipe, reward.model)
            functions.append(model)
            tokenizers.append(tokenizer)
            continue
        if reward.kind == "math" and (problem := math_checker_problem()):
            raise RewardError(f"objective.grpo.rewards.{index}.kind: {problem}.")
        user = reward.kind == "function"
        function = user_reward(reward.function) if user else builtin_reward(reward, grpo.max_completion_length)
        functions.append(CheckedReward(function, name, index, recipe.data.source, user, grpo.reward_time_limit_s))
        tokenizers.append(None)
    return functions, tokenizers


def load_reward_model(recipe: Recipe, model_id: str):
    """A sequence-classification reward model (one output) and its tokenizer, in the recipe's dtype, frozen.  A
    LoRA reward model tuner trained (an adapter folder: the adapters and the head) is loaded on its base and merged,
    so it scores as one model.  A type transformers has no sequence-classification class for loads through the
    class tuner trained it with (:mod:`tuner.loading.score_head`), chosen by its config's model_type."""
    from transformers import AutoConfig, AutoTokenizer

    from tuner.fileio import user_path
    from tuner.loading.model import cannot_load, refuse_custom_code, resolve_model_path, torch_dtype
    from tuner.loading.score_head import sequence_classification_class
    from tuner.rundir.summary import adapter_base

    folder = user_path(model_id)
    base = adapter_base(folder)
    source = resolve_model_path(base or model_id)
    refuse_custom_code(recipe, source)
    trust = recipe.model.trust_remote_code
    try:
        config = AutoConfig.from_pretrained(source, num_labels=1, trust_remote_code=trust)
        model = sequence_classification_class(config.model_type).from_pretrained(
            source, config=config, dtype=torch_dtype(recipe.model.dtype), trust_remote_code=trust)
        if base:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
        tokenizer = AutoTokenizer.from_pretrained(str(folder) if base else source, trust_remote_code=trust)
    except OSError as exc:
        raise cannot_load(model_id, exc) from None
    model.requires_grad_(False)
    model.eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
