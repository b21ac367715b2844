"""An Ollama Modelfile for an exported GGUF: FROM the file, the TEMPLATE that prompts as the run was trained, its
stop tokens, its system prompt and sampling.

Ollama's TEMPLATE is a Go template and a chat template is Jinja, so it is not translated by reading the Jinja:
the chat template is rendered on probe conversations (markers in place of each message) and cut into the text
before and after each role's content.  The Go template built from those pieces is rendered back, by the same
rules, on a three-turn and a system conversation and must give the chat template's text exactly; a template
that does not decompose that way (one that treats the first turn apart, or needs logic per message) is refused.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tuner.export import ExportRefused

MARKERS = {role: f"\x00{role}-{n}\x00" for role, n in (("system", 0), ("user", 1), ("assistant", 1), ("user2", 2))}


@dataclass(frozen=True)
class TemplatePieces:
    head: str  # once, before the first message (a BOS the template writes itself)
    system: tuple[str, str] | None  # text before and after a system message's content; None: no system role
    user: tuple[str, str]
    assistant: tuple[str, str]
    generation: str  # what asks for the answer after the last message

    def render(self, messages: list[dict[str, str]]) -> str:
        """What the Go template below renders for ``messages`` (the rules of ``go_template``, in Python)."""
        parts = [self.head]
        for message in messages:
            before, after = getattr(self, message["role"])
            parts += [before, message["content"], after]
        return "".join(parts + [self.generation])

    def go_template(self) -> str:
        for piece in (self.head, self.generation, *self.user, *self.assistant, *(self.system or ())):
            if "{{" in piece or "}}" in piece:
                raise ExportRefused("the chat template writes '{{' or '}}', which an Ollama TEMPLATE cannot hold as "
                                    "text; write the Modelfile's TEMPLATE by hand (--format gguf).")
        branches = [("user", self.user), ("assistant", self.assistant)]
        if self.system:
            branches.insert(0, ("system", self.system))
        body = "".join(f'{{{{ {"if" if i == 0 else "else if"} eq .Role "{role}" }}}}{before}{{{{ .Content }}}}{after}'
                       for i, (role, (before, after)) in enumerate(branches))
        return f"{self.head}{{{{ range .Messages }}}}{body}{{{{ end }}}}{{{{ end }}}}{self.generation}"


def _around(text: str, marker: str, start: int = 0) -> tuple[str, str]:
    index = text.find(marker, start)
    if index < 0:
        raise ExportRefused("the chat template drops a message's content; it has no Ollama TEMPLATE form.")
    return text[start:index], text[index + len(marker):]


def template_pieces(render) -> TemplatePieces:
    """Cut a chat template into pieces; ``render(messages, add_generation_prompt)`` renders it (with the user
    turn's instruction already applied by the caller)."""
    m = MARKERS
    user, assistant, user2 = ({"role": "user", "content": m["user"]}, {"role": "assistant", "content": m["assistant"]},
                              {"role": "user", "content": m["user2"]})
    one, two, three = render([user], False), render([user, assistant], False), render([user, assistant, user2], False)
    asked = render([user, assistant, user2], True)
    if not (two.startswith(one) and three.startswith(two) and asked.startswith(three)):
        raise ExportRefused("the chat template does not render conversations as growing prefixes; it has no Ollama "
                            "TEMPLATE form (write one by hand with --format gguf).")
    generation = asked[len(three):]
    user_before, user_after = _around(three[len(two):], m["user2"])
    assistant_block = two[len(one):]
    assistant_before, assistant_after = _around(assistant_block, m["assistant"])
    first_before, first_after = _around(one, m["user"])
    if not first_before.endswith(user_before) or first_after != user_after:
        raise ExportRefused("the chat template renders the first user turn unlike the others; it has no Ollama "
                            "TEMPLATE form (write one by hand with --format gguf).")
    head = first_before[:len(first_before) - len(user_before)]
    system = None
    try:
        with_system = render([{"role": "system", "content": m["system"]}, user], False)
    except Exception:  # a template that refuses a system turn (raise_exception in Jinja)
        with_system = None
    if with_system and with_system.startswith(head) and m["system"] in with_system:
        before, rest = _around(with_system, m["system"], len(head))
        after = rest[:rest.find(m["user"]) - len(user_before)] if m["user"] in rest else None
        if after is not None:
            system = (before, after)
    pieces = TemplatePieces(head, system, (user_before, user_after), (assistant_before, assistant_after), generation)
    probes = [[user, assistant, user2]] + ([[{"role": "system", "content": m["system"]}, user]] if system else [])
    for messages in probes:
        if pieces.render(messages) != render(messages, True):
            raise ExportRefused("the chat template does not translate to an Ollama TEMPLATE (its pieces do not "
                                "render it back); write one by hand with --format gguf.")
    return pieces


def _quoted(text: str) -> str:
    """A Modelfile value: triple-quoted (Ollama's multi-line string) unless it holds triple quotes itself."""
    if '"""' in text:
        raise ExportRefused('a Modelfile value holds """, which a Modelfile cannot quote.')
    return f'"""{text}"""'


def ollama_name(name: str) -> str:
    """A model name Ollama accepts (lower-case letters, digits, '.', '_', '-')."""
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "tuner-model"


def modelfile_text(gguf_name: str, pieces: TemplatePieces, stops: list[str], system: str | None,
                   parameters: dict[str, float]) -> str:
    lines = [f"# Written by tuner export: ollama create NAME -f Modelfile", f"FROM ./{gguf_name}",
             f"TEMPLATE {_quoted(pieces.go_template())}"]
    lines += [f"PARAMETER stop {json.dumps(stop)}" for stop in stops]
    lines += [f"PARAMETER {key} {value:g}" for key, value in parameters.items()]
    if system:
        lines.append(f"SYSTEM {_quoted(system)}")
    return "\n".join(lines) + "\n"
