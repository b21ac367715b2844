"""The limits ``tuner serve`` puts in front of transformers' server: a thin ASGI layer that checks every request
before the server sees it, so one client cannot take the server from the others.

transformers' server (``transformers serve``) trusts its clients: it passes ``max_tokens`` on as it comes (10^12
tokens, or a string, reach ``generate``), tokenises a prompt of any size on its event loop, reads a body of any
size, and answers a bad field with HTTP 500 and a traceback in the log.  In front of it:

- a body is read up to :data:`MAX_BODY_BYTES` (413 beyond), must be a JSON object (400 otherwise);
- only the chat-completions route, ``/v1/models`` and ``/health`` are served (404: loading another model, resetting
  the loaded one, or the other routes this layer does not check);
- every field tuner bounds is checked with its range (400 naming the field): ``messages`` (roles, text),
  ``max_tokens``/``max_completion_tokens`` (1 to what the context leaves after the prompt), ``temperature``,
  ``top_p``, ``frequency_penalty``, ``seed``, ``logit_bias`` (token ids of this vocabulary), ``stop``; an
  ``image_url`` part only for an image-text model and only as a data URL of an image within
  ``data.max_image_pixels`` (a remote URL is refused: nothing is fetched; the body's bound caps its bytes); a
  ``generation_config`` (which would replace all of them) is refused;
- the body must arrive within :data:`BODY_TIMEOUT_S` of its headers (408 and the connection closed otherwise: a
  ``Content-Length`` longer than the body sent is answered then);
- the prompt is rendered through the model's chat template within its bounds (:mod:`tuner.data.chat_template`:
  a template past one answers this request with a 500 naming the file, and the server stays as it was) and counted
  in tokens, off the event loop; one that with its answer exceeds the model's context is refused naming the limit;
  a request without ``max_tokens`` gets the recipe's ``inference.max_new_tokens``, capped by what the context
  leaves; ``chat_template_kwargs`` (variables a client would hand the template) are refused;
- at most :data:`MAX_ACTIVE_REQUESTS` requests are served at once, counted once their body is in (503 beyond): a
  connection still sending its headers (:mod:`tuner.infer.connection_limits`) or its body takes no place;
- ``GET /health`` answers 503 naming the oldest request while one has been served for longer than its time budget
  plus :data:`STUCK_SLACK_S` (a stuck worker), else the server's own answer;
- an error inside the server is one log line and a JSON 500, never a traceback.

Generation itself is bounded by the server's own means (see :class:`tuner.infer.serve.Server`): each request's
``generate`` stops after its time budget (``max_time``), and SIGTERM stops the server within its graceful-shutdown
timeout.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from tuner.reason import library_words

log = logging.getLogger("tuner")

MAX_BODY_BYTES = 1024 * 1024
BODY_TIMEOUT_S = 10.0  # from a request's headers to the end of its body
MAX_ACTIVE_REQUESTS = 32  # requests served at once (their bodies read); 503 beyond
STUCK_SLACK_S = 5.0  # past its time budget by this much, a request is reported stuck by /health
MAX_MESSAGES = 1024
MAX_STOP_STRINGS = 4
MAX_STOP_CHARACTERS = 256
MAX_LOGIT_BIAS = 1024
SEED_LIMIT = 2**63 - 1  # what torch.manual_seed takes
CHAT_ROUTE = "/v1/chat/completions"
OPEN_ROUTES = {("GET", "/health"), ("GET", "/v1/models"), ("OPTIONS", "/v1/models"), ("POST", CHAT_ROUTE)}
ROLES = ("system", "developer", "user", "assistant", "tool")


class Refused(ValueError):
    """A request tuner will not pass on: the HTTP status, the field, and the message for the client."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.field = field


@dataclass(frozen=True)
class Limits:
    """What a request may ask of this model."""

    context: int | None  # the model's longest sequence (prompt and answer); None: not known
    default_max_tokens: int  # the recipe's inference.max_new_tokens
    vocab_size: int
    count_tokens: Callable[[list[dict], Any], int]  # the prompt's length (messages, tools) as the server tokenises
    # it, rendered within the template's bounds (TemplateRefused past one)
    time_budget_s: float = math.inf  # one request's generation (--request-timeout)
    max_image_pixels: int | None = None  # an image-text model's bound per image_url part; None: text only


def _number(body: dict, name: str, low: float, high: float, *, integer: bool = False, low_open: bool = False,
            high_because: str = ""):
    value = body.get(name)
    if value is None:
        return None
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or (isinstance(value, float) and not math.isfinite(value)):
        raise Refused(400, f"{name}: must be {'an integer' if integer else 'a finite number'}, got {value!r:.40}.", name)
    if value < low or value > high or (low_open and value == low):
        bound = f"more than {low}" if low_open else f"at least {low}"
        raise Refused(400, f"{name}: must be {bound} and at most {high}{high_because}, got {value!r:.40}.", name)
    return value


def message_text(message: dict) -> str:
    """A message's text, as transformers' server collapses it for a language model (text parts joined)."""
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _check_image(part: dict, where: str, limits: Limits) -> None:
    """An ``image_url`` part: a data URL of an image within the bounds (the body's own bound caps its bytes).  A
    remote URL is refused, never fetched: transformers' server would download whatever it names."""
    import base64
    import binascii

    from tuner.data.images import ImageProblem, open_image

    if limits.max_image_pixels is None:
        raise Refused(400, f"{where}: this model reads text only; send {{type: text, text}} parts.", "messages")
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str) or not url.startswith("data:"):
        raise Refused(400, f"{where}.image_url.url: only data: URLs are accepted (data:image/png;base64,...); tuner "
                           "serve fetches nothing from the network.", "messages")
    header, _, payload = url.partition(",")
    if not header.startswith("data:image/") or not header.endswith(";base64"):
        raise Refused(400, f"{where}.image_url.url: a data URL of a base64 image (data:image/png;base64,...).",
                      "messages")
    try:
        open_image({"bytes": base64.b64decode(payload, validate=True)}, None, limits.max_image_pixels)
    except (binascii.Error, ValueError) as exc:  # ImageProblem is a ValueError
        reason = str(exc) if isinstance(exc, ImageProblem) else "not valid base64"
        raise Refused(400, f"{where}.image_url: {reason}.", "messages") from None


def _check_messages(body: dict, limits: Limits) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused(400, "messages: must be a non-empty list of {role, content}.", "messages")
    if len(messages) > MAX_MESSAGES:
        raise Refused(400, f"messages: at most {MAX_MESSAGES} messages, got {len(messages)}.", "messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise Refused(400, f"{where}: must be an object whose role is one of {', '.join(ROLES)}.", "messages")
        content = message.get("content")
        parts_ok = isinstance(content, list) and all(
            isinstance(part, dict) and (part.get("type") == "text" and isinstance(part.get("text"), str)
                                        or part.get("type") == "image_url")
            for part in content)
        if not (isinstance(content, str) or parts_ok or (content is None and message["role"] == "assistant")):
            raise Refused(400, f"{where}.content: must be text, or a list of {{type: text, text}} (or, for an "
                               "image-text model, {type: image_url, image_url: {url: data:...}}) parts.", "messages")
        for number, part in enumerate(content if parts_ok else []):
            if part["type"] == "image_url":
                _check_image(part, f"{where}.content[{number}]", limits)
    return messages


def _check_fields(body: dict, limits: Limits) -> None:
    if "generation_config" in body:
        raise Refused(400, "generation_config: not accepted by tuner serve (it would replace the limits on "
                           "max_tokens and time); send max_tokens, temperature, top_p, seed or stop.", "generation_config")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise Refused(400, "stream: must be true or false.", "stream")
    if "chat_template_kwargs" in body:
        raise Refused(400, "chat_template_kwargs: not accepted by tuner serve (the model's chat template is rendered "
                           "with the messages and tools only).", "chat_template_kwargs")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise Refused(400, "model: must be text (GET /v1/models lists the one served).", "model")
    _number(body, "temperature", 0, 100)
    _number(body, "top_p", 0, 1, low_open=True)
    _number(body, "frequency_penalty", -2, 2)
    _number(body, "seed", 0, SEED_LIMIT, integer=True)
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
            raise Refused(400, f"logit_bias: must map at most {MAX_LOGIT_BIAS} token ids to numbers.", "logit_bias")
        for key, value in bias.items():
            if not (key.isascii() and key.isdigit() and len(key) <= 12 and int(key) < limits.vocab_size):
                raise Refused(400, f"logit_bias: {key[:40]!r} is not a token id of this model (0 to "
                                   f"{limits.vocab_size - 1}).", "logit_bias")
            _number({"logit_bias": value}, "logit_bias", -100, 100)
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not (isinstance(stops, list) and len(stops) <= MAX_STOP_STRINGS and all(
                isinstance(item, str) and 0 < len(item) <= MAX_STOP_CHARACTERS for item in stops)):
            raise Refused(400, f"stop: one text or a list of at most {MAX_STOP_STRINGS}, each 1 to "
                               f"{MAX_STOP_CHARACTERS} characters.", "stop")


async def check_chat_request(body: Any, limits: Limits) -> dict:
    """The request as it may reach the server (``max_tokens`` always set, within the context), or :class:`Refused`."""
    if not isinstance(body, dict):
        raise Refused(400, "the request body must be a JSON object.")
    messages = _check_messages(body, limits)
    _check_fields(body, limits)
    context = limits.context
    because = f" (less than the model's context of {context} tokens)" if context else ""
    asked = {name: _number(body, name, 1, context - 1 if context else SEED_LIMIT, integer=True, high_because=because)
             for name in ("max_completion_tokens", "max_tokens")}
    field = "max_completion_tokens" if asked["max_completion_tokens"] is not None else "max_tokens"
    max_tokens = asked[field]
    prompt = await asyncio.get_running_loop().run_in_executor(None, _count, limits, messages, body.get("tools"))
    if context is None:
        body["max_tokens"] = max_tokens or limits.default_max_tokens
        return body
    room = context - prompt
    if room < 1 or (max_tokens is not None and max_tokens > room):
        wanted = max_tokens or 1
        raise Refused(400, f"messages: the prompt is {prompt} tokens and the answer may take {wanted} ({field}): more "
                           f"than the model's context of {context} tokens; the prompt may be at most {context - wanted} "
                           "tokens.", "messages")
    body.pop("max_completion_tokens", None)
    body["max_tokens"] = max_tokens or min(limits.default_max_tokens, room)
    return body


def _count(limits: Limits, messages: list[dict], tools) -> int:
    from tuner.data.chat_template import TemplateRefused

    try:
        return limits.count_tokens(messages, tools)
    except TemplateRefused as exc:  # the model's template, not the client's request: the server's error
        raise Refused(500, str(exc), "messages") from None


def _json_response(status: int, payload: dict) -> tuple[list, bytes]:
    data = json.dumps(payload).encode()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())], data


class RequestLimits:
    """The ASGI application in front of transformers' FastAPI app (see the module's docstring)."""

    def __init__(self, app: Callable[..., Awaitable[None]], limits: Limits):
        self.app = app
        self.limits = limits
        self.started: dict[int, float] = {}  # the requests being served: when each took its place

    def stuck(self) -> float | None:
        """How long the oldest request has been served, when that is past its budget and the slack; else None."""
        oldest = time.monotonic() - min(self.started.values(), default=time.monotonic())
        return oldest if oldest > self.limits.time_budget_s + STUCK_SLACK_S else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":  # lifespan: the app's own start-up and shut-down
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if (scope["method"], scope["path"]) not in OPEN_ROUTES:
                raise Refused(404, f"{scope['method']} {scope['path']}: not served by tuner serve (it serves POST "
                                   f"{CHAT_ROUTE}, GET /v1/models and GET /health).")
            if (scope["method"], scope["path"]) == ("GET", "/health") and (age := self.stuck()) is not None:
                await self._answer(send, 503, {"status": "stuck", "message": (
                    f"a request has been served for {age:.0f} s, past its budget of {self.limits.time_budget_s:g} s "
                    f"(--request-timeout) and {STUCK_SLACK_S:g} s more")})
                return
            if scope["method"] != "POST":
                await self.app(scope, receive, tracked_send)
                return
            body = await self._json_body(scope, receive)
            if len(self.started) >= MAX_ACTIVE_REQUESTS:
                raise Refused(503, f"the server is serving {MAX_ACTIVE_REQUESTS} requests at once; retry shortly.")
            self.started[id(scope)] = time.monotonic()
            try:
                body = await check_chat_request(body, self.limits)
                await self.app(scope, _replay(json.dumps(body).encode(), receive), tracked_send)
            finally:
                self.started.pop(id(scope), None)
        except Refused as refused:
            if not started:
                kind = "server_error" if refused.status >= 500 else "invalid_request_error"
                error = {"message": str(refused), "type": kind, "param": refused.field}
                await self._answer(send, refused.status, {"error": error}, close=refused.status == 408)
        except Exception as exc:  # never a traceback for a client's request: one line in the log, a JSON 500
            log.error("request %s %s failed: %s: %s", scope["method"], scope["path"], type(exc).__name__,
                      library_words(exc, 200))
            if not started:
                await self._answer(send, 500, {"error": {"message": f"internal error: {type(exc).__name__}",
                                                         "type": "server_error", "param": None}})

    async def _json_body(self, scope, receive) -> Any:
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
            raise Refused(413, f"the request body may hold {MAX_BODY_BYTES} bytes; this one declares {declared[:20]!r}.")
        chunks, size = [], 0
        deadline = time.monotonic() + BODY_TIMEOUT_S
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0))
            except asyncio.TimeoutError:
                raise Refused(408, f"the request body did not arrive within {BODY_TIMEOUT_S:g} s of its headers "
                                   f"({size} of {declared.decode() if declared else 'its'} bytes came).") from None
            if message["type"] == "http.disconnect":
                raise Refused(400, "the client went away before its request was read.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise Refused(413, f"the request body may hold {MAX_BODY_BYTES} bytes; this one is longer.")
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, RecursionError):
            raise Refused(400, "the request body is not JSON.") from None

    @staticmethod
    async def _answer(send, status: int, payload: dict, close: bool = False) -> None:
        headers, data = _json_response(status, payload)
        if close:  # a body that did not arrive: what the client sends next is not a request
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _replay(body: bytes, receive):
    """A ``receive`` that hands the (checked, rewritten) body to the app once, then the client's own messages (its
    disconnect cancels a streamed answer)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
