"""Every chat template tuner renders, rendered within a time and a size bound.

A chat template is code from whoever published the model (``chat_template.jinja``, or ``chat_template`` in
``tokenizer_config.json``).  transformers renders it in jinja2's sandbox, which stops a template from reaching
Python's internals but not from running for hours (two nested ``range(100000)`` loops) or from filling memory
(a string doubled 40 times).  Inference, chat, the server, export, evaluation, data formatting and the wizard's
preview all render here instead, in the same sandbox with the same globals as transformers
(:func:`_transformers_environment`), so the text is the one ``apply_chat_template`` gives, and:

- a deadline is checked at every loop iteration, call, filter, attribute, operator and piece of output;
- every value an operation builds is weighed (characters of text, items of a list) before the operation when it
  could amplify (``*``, ``+``, ``~``, ``%``, ``**``, ``replace``, ``join``, ``indent``, ``format``, widths, ...)
  and after it otherwise: none may exceed the output bound, and all of one render's together at most
  :data:`TOTAL_FACTOR` times it, which bounds its memory;
- the output is produced piece by piece and stops past the bound.

Bounds, read from the environment so that every process (server, training ranks, the wizard) applies them:
``TUNER_TEMPLATE_TIMEOUT_S`` (default :data:`DEFAULT_TIMEOUT_S` seconds per render) and
``TUNER_TEMPLATE_MAX_CHARS`` (default :data:`DEFAULT_MAX_CHARS` characters of output).  A template past one is
:class:`TemplateRefused`, naming its file and the bound.
"""
from __future__ import annotations

import contextvars
import functools
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.reason import library_words

TIMEOUT_ENV = "TUNER_TEMPLATE_TIMEOUT_S"
MAX_CHARS_ENV = "TUNER_TEMPLATE_MAX_CHARS"
DEFAULT_TIMEOUT_S = 5.0  # a real template renders a conversation in milliseconds
DEFAULT_MAX_CHARS = 4 * 1024 * 1024  # 4 Mi characters: a prompt far beyond any model's context
TOTAL_FACTOR = 16  # all values one render builds, together, as a multiple of the output bound
MAX_TEMPLATE_CHARS = 1024 * 1024  # a template's own text (compiling is not interruptible; real ones are < 100 KB)
MAX_INT_BITS = 1 << 16  # a number built by * or ** (big-integer arithmetic is not interruptible either)
MAX_NESTING = 64  # lists in lists deeper than this are refused (their text is built in one C call)
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"

_WIDTH = re.compile(r"\d+")


class TemplateRefused(ValueError):
    """A chat template that passed a bound, or whose own code failed on a conversation; the message names the
    template's file and what to do."""


@dataclass(frozen=True)
class Bounds:
    timeout_s: float
    max_chars: int


def bounds() -> Bounds:
    """The bounds of this process: the environment's, else the defaults."""
    values = []
    for name, default, kind in ((TIMEOUT_ENV, DEFAULT_TIMEOUT_S, float), (MAX_CHARS_ENV, DEFAULT_MAX_CHARS, int)):
        raw = os.environ.get(name)
        try:
            value = default if raw in (None, "") else kind(raw)
        except ValueError:
            value = 0
        if not value > 0:
            raise TemplateRefused(f"{name}={raw!r}: must be a positive {'number' if kind is float else 'integer'} "
                                  f"(default {default}).")
        values.append(value)
    return Bounds(*values)


class _Exceeded(Exception):
    """Raised inside a render past a bound (no template code can catch it: jinja has no try)."""


class _Budget:
    """One render's deadline and sizes."""

    def __init__(self, limits: Bounds):
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout_s
        self.total = 0
        self.output = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Exceeded(f"it rendered for longer than {self.limits.timeout_s:g} s (the bound {TIMEOUT_ENV})")

    def allow(self, size: int, what: str = "a value") -> None:
        """Account for ``size`` characters (or items) about to be built."""
        self.tick()
        self.total += size
        if size > self.limits.max_chars or self.total > TOTAL_FACTOR * self.limits.max_chars:
            raise _Exceeded(f"it built {what} of more than {self.limits.max_chars} characters (the bound "
                            f"{MAX_CHARS_ENV})" if size > self.limits.max_chars else
                            f"its values came to more than {TOTAL_FACTOR} x {self.limits.max_chars} characters "
                            f"(the bound {MAX_CHARS_ENV})")

    def emit(self, text: str) -> None:
        self.allow(len(text), "output")
        self.output += len(text)
        if self.output > self.limits.max_chars:
            raise _Exceeded(f"its output passed {self.limits.max_chars} characters (the bound {MAX_CHARS_ENV})")


_budget: contextvars.ContextVar[_Budget] = contextvars.ContextVar("tuner_template_budget")


@functools.cache
def _namespace_type() -> type:
    from jinja2.utils import Namespace

    return Namespace


def _weight(value: Any, cap: int, depth: int = 0) -> int:
    """Characters of text and items of containers in ``value`` (a namespace's and a dict's keys and values
    included), counted until past ``cap``; the deadline is checked at every container (a list may hold itself
    many times over, built without a copy)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, _namespace_type()):
        value = value._Namespace__attrs  # noqa: SLF001: its repr prints them all
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if not isinstance(value, (list, tuple, set, frozenset)):
        return 1
    if depth > MAX_NESTING:
        raise _Exceeded(f"it nested lists more than {MAX_NESTING} deep")
    _budget.get().tick()
    total = len(value)
    for item in value:
        if total > cap:
            break
        total += _weight(item, cap - total, depth + 1)
    return total


def _check_args(budget: _Budget, args, kwargs) -> list[int]:
    """The weights of the arguments; an integer beyond the output bound (a width, a count) is refused."""
    limit = budget.limits.max_chars
    weights = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
            raise _Exceeded(f"it passed {value:.3g} to a call, beyond the output bound of {limit} characters "
                            f"({MAX_CHARS_ENV})")
        weights.append(_weight(value, limit))
    return weights


def _widest(text: str, limit: int) -> int:
    """The largest number in a format string (its widest field): one beyond the bound is refused."""
    widest = max((len(run) for run in _WIDTH.findall(text)), default=0)
    if widest > len(str(limit)) or (widest and max(int(run) for run in _WIDTH.findall(text)) > limit):
        raise _Exceeded(f"its format string asks for a width beyond {limit} characters ({MAX_CHARS_ENV})")
    return max((int(run) for run in _WIDTH.findall(text)), default=0)


def _estimate(name: str, receiver: Any, args: tuple, weights: list[int], limit: int) -> int:
    """An upper bound on the size of what the text operation ``name`` builds, before it runs (these are the
    operations whose result can be far larger than their arguments); 0 for the others."""
    text = receiver if isinstance(receiver, str) else ""
    largest = max(weights, default=0)
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str):
        old, new = args[0], args[1]
        occurrences = len(text) + 1 if old == "" else text.count(old)
        return len(text) + occurrences * _weight(new, limit)
    if name == "join":  # str.join(items), or the filter items|join(separator)
        items, separator = (args[0] if args else (), text) if text else (receiver, args[0] if args else "")
        return _weight(items, limit) * (1 + _weight(separator, limit))
    if name == "expandtabs":
        return len(text) + text.count("\t") * (args[0] if args and isinstance(args[0], int) else 8)
    if name == "indent":
        width = args[0] if args else 4
        return len(text) + (text.count("\n") + 1) * (width if isinstance(width, int) else _weight(width, limit))
    if name in ("format", "format_map", "%"):
        return len(text) + (text.count("{") + text.count("%")) * (_widest(text, limit) + largest)
    return 0


_PLUMBING = ("_loop_vars", "_block_vars", "caller")  # what jinja itself passes to a call


def _run_checked(name: str, receiver: Any, values: list, func, args: tuple, kwargs: dict):
    """``func(*args, **kwargs)`` (a filter, a text method, any call) checked against the budget: its arguments
    (``values``, ``receiver`` the text it acts on) before, an estimate of what an amplifying operation builds
    before, and its result after."""
    budget = _budget.get()
    limit = budget.limits.max_chars
    if name == "join":  # what it joins, listed first (a map or select is a generator: weighed, it would be spent)
        at = values.index(receiver) if receiver is not None and not isinstance(receiver, str) else 1
        if at < len(values) and not hasattr(values[at], "__len__"):
            listed = [item for item in values[at] if budget.tick() is None]
            args = tuple(listed if value is values[at] else value for value in args)
            values = [listed if index == at else value for index, value in enumerate(values)]
            receiver = listed if at == 0 else receiver
    plain = {key: value for key, value in kwargs.items() if key not in _PLUMBING}
    weights = _check_args(budget, values, plain)
    estimate = _estimate(name, receiver, tuple(values[1:] if receiver is not None else values), weights, limit)
    if estimate:
        budget.allow(estimate, f"the result of {name}")
    result = func(*args, **kwargs)
    budget.allow(_weight(result, limit), f"the result of {name}")
    return result


def _bounded_filter(name: str, func):
    """A filter that reports to the budget (a context or environment jinja passes first is not an argument)."""

    @functools.wraps(func)
    def bounded(*args, **kwargs):
        values = [value for value in args if not _is_jinja_state(value)]
        return _run_checked(name, values[0] if values else None, values, func, args, kwargs)

    return bounded


def _is_jinja_state(value: Any) -> bool:
    from jinja2 import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return isinstance(value, (Context, EvalContext, Environment))


@functools.lru_cache(maxsize=1)
def _transformers_environment():
    """transformers' own chat-template environment (its extensions, globals and ``tojson``), read from the template
    it compiles, so this module renders exactly what ``apply_chat_template`` does and defines none of it again."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template("").environment


@functools.lru_cache(maxsize=1)
def _environment():
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCode(CodeGenerator):
        """Code whose loops, buffers and ``~`` report to the budget."""

        def visit_Template(self, node, frame=None):
            for loop in list(node.find_all(nodes.For)):
                loop.iter = nodes.Call(nodes.EnvironmentAttribute("bounded_iter"), [loop.iter], [], None, None)
            super().visit_Template(node, frame)

        def buffer(self, frame):
            frame.buffer = self.temporary_identifier()
            self.writeline(f"{frame.buffer} = environment.bounded_buffer()")

        def visit_Concat(self, node, frame):
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedBuffer(list):
        """What a macro, ``set`` block or ``filter`` block writes into: every piece counted as output is."""

        def append(self, text):
            budget = _budget.get()
            budget.allow(_weight(text, budget.limits.max_chars), "a block's text")
            super().append(text)

        def extend(self, texts):
            texts = tuple(texts)
            budget = _budget.get()
            budget.allow(sum(_weight(text, budget.limits.max_chars) for text in texts), "a block's text")
            super().extend(texts)

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        code_generator_class = BoundedCode
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        def __init__(self, model):
            super().__init__(trim_blocks=True, lstrip_blocks=True, finalize=self.weighed,
                             extensions=[type(extension) for extension in model.extensions.values()])
            self.globals.update(model.globals)
            self.filters.update(model.filters)
            self.filters = {name: _bounded_filter(name, func) for name, func in self.filters.items()}

        @staticmethod
        def weighed(value):
            """Every ``{{ value }}`` is weighed before it becomes text (a list's text is built in one C call)."""
            budget = _budget.get()
            budget.allow(_weight(value, budget.limits.max_chars), "output")
            return value

        @staticmethod
        def bounded_iter(iterable):
            budget = _budget.get()
            for item in iterable:
                budget.tick()
                yield item

        @staticmethod
        def bounded_buffer():
            return BoundedBuffer()

        @staticmethod
        def bounded_concat(parts):
            budget = _budget.get()
            budget.allow(sum(_weight(part, budget.limits.max_chars) for part in parts), "a '~' join")
            return "".join(part if isinstance(part, str) else str(part) for part in parts)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805: jinja's own signature
            target = getattr(__obj, "__wrapped__", __obj)  # str.format, as the sandbox wraps it
            receiver = getattr(target, "__self__", None)
            receiver = receiver if isinstance(receiver, str) else None

            def run(*args, **kwargs):
                return super(BoundedEnvironment, __self).call(__context, __obj, *args, **kwargs)

            values = [receiver, *args] if receiver is not None else list(args)
            return _run_checked(getattr(target, "__name__", "a call"), receiver, values, run, args, kwargs)

        def call_binop(self, context, operator, left, right):
            budget = _budget.get()
            limit = budget.limits.max_chars
            budget.tick()
            if isinstance(left, int) and isinstance(right, int) and (
                    (operator == "**" and abs(left) > 1 and right > 0 and abs(left).bit_length() * right > MAX_INT_BITS)
                    or (operator == "*" and left.bit_length() + right.bit_length() > MAX_INT_BITS)):
                raise _Exceeded(f"it built a number of more than {MAX_INT_BITS} bits")
            sized = [value for value in (left, right) if not isinstance(value, (int, float))]
            if operator == "*" and len(sized) == 1:
                count = right if sized[0] is left else left
                budget.allow(_weight(sized[0], limit) * max(count, 0) if isinstance(count, int) else 0,
                             "a repeated value")
            elif operator == "+" and len(sized) == 2:
                budget.allow(_weight(left, limit) + _weight(right, limit), "a '+' join")
            elif operator == "%" and isinstance(left, str):
                budget.allow(_estimate("%", left, (), [_weight(right, limit)], limit), "a '%' format")
            return super().call_binop(context, operator, left, right)

    return BoundedEnvironment(_transformers_environment())


@functools.lru_cache(maxsize=32)
def _compiled(template: str):
    return _environment().from_string(template)


def render(template: str, messages: list[dict], source: str, add_generation_prompt: bool = False,
           **variables: Any) -> str:
    """``template`` rendered on ``messages`` as transformers renders it (``apply_chat_template``'s variables:
    the messages without their None fields, ``tools``, ``documents``, the generation prompt, ``variables``), within
    :func:`bounds`; ``source`` names the template's file in a refusal."""
    limits = bounds()
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateRefused(f"{source}: the chat template is {len(template)} characters long, more than a chat "
                              f"template may be ({MAX_TEMPLATE_CHARS}); fix or replace the template.")
    _environment()  # transformers imported, the environment built: outside the time bound
    budget = _Budget(limits)
    token = _budget.set(budget)
    try:
        compiled = _compiled(template)  # compiled under the budget: jinja folds constant filters while compiling
        context = {"tools": None, "documents": None, **variables, "add_generation_prompt": add_generation_prompt,
                   "messages": [{key: value for key, value in message.items() if value is not None}
                                for message in messages]}
        pieces = []
        for piece in compiled.generate(**context):
            budget.emit(piece)
            pieces.append(piece)
        return "".join(pieces)
    except _Exceeded as exc:
        raise TemplateRefused(f"{source}: the chat template was stopped: {exc}. Fix or replace the template (or "
                              "raise the bound if the template is honest).") from None
    except (RecursionError, MemoryError) as exc:
        raise TemplateRefused(f"{source}: the chat template was stopped: {'it recursed deeper than Python allows' if isinstance(exc, RecursionError) else 'it ran out of memory'}. Fix or replace the template.") from None
    except Exception as exc:  # the template's own code failing (jinja and its filters raise any type)
        reason = library_words(exc)
        raise TemplateRefused(f"{source}: the chat template cannot render this conversation ({type(exc).__name__}: "
                              f"{reason}); fix the template.") from None
    finally:
        _budget.reset(token)


def template_source(tokenizer, template: str) -> str:
    """Where ``template`` comes from, for messages: the tokenizer folder's ``chat_template.jinja`` or
    ``tokenizer_config.json`` (transformers reads the first when both exist; the file a link points to), or tuner's
    own template."""
    if template != tokenizer.chat_template:
        return "tuner's chat template for this data format"
    folder = Path(getattr(tokenizer, "name_or_path", "") or ".")
    for name in (TEMPLATE_FILE, TOKENIZER_CONFIG):
        if (folder / name).is_file():
            return str((folder / name).resolve())  # a serving folder links the model's own
    return f"the chat template of {tokenizer.name_or_path} ({TEMPLATE_FILE} or {TOKENIZER_CONFIG})"


def render_chat(tokenizer, messages: list[dict], template: str | None = None, add_generation_prompt: bool = False,
                **variables: Any) -> str:
    """``tokenizer.apply_chat_template(messages, tokenize=False, ...)`` within bounds: ``template`` (default the
    tokenizer's) with the tokenizer's special tokens."""
    template = template or tokenizer.chat_template
    return render(template, messages, template_source(tokenizer, template), add_generation_prompt,
                  **{**tokenizer.special_tokens_map, **variables})


def chat_ids(tokenizer, messages: list[dict], template: str | None = None, add_generation_prompt: bool = False,
             **variables: Any) -> list[int]:
    """The token ids ``apply_chat_template(..., tokenize=True)`` gives: the rendered text, tokenised without adding
    special tokens (the template writes its own)."""
    text = render_chat(tokenizer, messages, template, add_generation_prompt, **variables)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
