"""Hostile chat templates against tuner's bounded renderer (tuner.data.chat_template), issue 48.

Generates templates (seeded, so a rerun renders the same ones) over the classes a published template can use to
hang or fill memory: loops (nested ranges, literal lists, messages repeated), doubling (``+``, ``~``, ``*``,
``join``, ``replace``, ``%``, ``format``, lists), recursion through macros, huge literals, filters with widths or
counts, attribute tricks (``str.format`` widths, ``expandtabs``, nested namespaces, dicts), and each mixed with
honest text and the messages.  Each is rendered on a conversation in its own forked process and reported as:

- refused: TemplateRefused naming the file and a bound (the expected outcome for the hostile ones);
- rendered: finished within both bounds (a template whose growth stays small);
- hang: took longer than the time bound + 1 s (the parent kills a child at 60 s);
- memory: the child's peak resident memory grew by more than MEMORY_BOUND_MIB;
- traceback: any other exception.

Run: nice -n 10 python benchmarks/hostile_templates.py [--cases 600] [--seed 48]
(results in benchmarks/results/hostile-templates_<date>_cpu.md; bounds: TUNER_TEMPLATE_TIMEOUT_S=1 here so the
spinning cases take a second each, TUNER_TEMPLATE_MAX_CHARS at its default)
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TUNER_TEMPLATE_TIMEOUT_S", "1")
RESULTS = REPO / "benchmarks" / "results"
MEMORY_BOUND_MIB = 512  # 16 x 4 Mi characters of values, at up to 4 bytes a character, and Python's overhead
SLACK_S = 1.0
KILL_S = 60
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "reverse\nabc " * 20},
            {"role": "assistant", "content": "cba"}, {"role": "user", "content": "again"}]


def loops(rng: random.Random) -> str:
    depth = rng.randint(2, 4)
    sources = ["range(100000)", "[0]*100000", "messages * 30000", "range(99999)|list", "'x' * 100000",
               "range(100000)|batch(1)"]
    body = rng.choice(["", "{{ '' }}", "{% if i == 3 %}{% endif %}", "{% set x = i %}", "{{ i|string|length }}"])
    head = "".join(f"{{% for i{d} in {rng.choice(sources)} %}}" for d in range(depth))
    return head + body.replace("i ", "i0 ").replace("(i)", "(i0)").replace("i|", "i0|") + "{% endfor %}" * depth


def doubling(rng: random.Random) -> str:
    steps = ["{% set ns.s = ns.s + ns.s %}", "{% set ns.s = ns.s ~ ns.s %}", "{% set ns.s = ns.s * 2 %}",
             "{% set ns.s = [ns.s, ns.s]|join %}", "{% set ns.s = ns.s|replace('a', 'aa') %}",
             "{% set ns.s = '%s%s' % (ns.s, ns.s) %}", "{% set ns.s = '{0}{0}'.format(ns.s) %}",
             "{% set ns.s = ns.s.replace('a', 'aa') %}", "{% set ns.l = ns.l + ns.l %}",
             "{% set ns.l = [ns.l, ns.l] %}", "{% set ns.s = ns.s|indent(2, true) ~ ns.s %}",
             "{% set ns.d = {'a': ns.d, 'b': ns.d} %}", "{% set ns.s = (ns.s ~ ns.l|string) %}"]
    chosen = "".join(rng.sample(steps, rng.randint(1, 3)))
    show = rng.choice(["{{ ns.s }}", "{{ ns.l }}", "{{ ns|string }}", "{{ ns.d }}", "{{ (ns.s ~ ns.l)|length }}",
                       "{{ ns.s|length }}{{ ns.l|tojson }}", "{{ ns.d|tojson }}"])
    body = f"{{% for i in range({rng.randint(25, 64)}) %}}{chosen}{{% endfor %}}{show}"
    if rng.random() < 0.3:
        body = f"{{% macro grow() %}}{body}{{% endmacro %}}{{{{ grow() }}}}"
    return "{% set ns = namespace(s='ab', l=['ab'], d={'a': 'ab'}) %}" + body


def recursion(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
    if kind == 1:
        return "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('ab') }}"
    if kind == 2:
        fan = rng.randint(2, 4)
        calls = "".join("{{ f(n - 1) }}" for _ in range(fan))
        return f"{{% macro f(n) %}}{{% if n > 0 %}}{calls}{{% else %}}x{{% endif %}}{{% endmacro %}}{{{{ f({rng.randint(20, 40)}) }}}}"
    return "{% for m in [[1, [1]]] recursive %}{{ loop([m, m]) }}{% endfor %}"


def huge_literal(rng: random.Random) -> str:
    size = rng.choice([5, 8, 12]) * 1024 * 1024
    kind = rng.randrange(3)
    if kind == 0:
        return "x" * size  # template text itself: the output passes the bound
    if kind == 1:
        return "{{ '" + "y" * size + "' }}"
    return "{% for i in range(100) %}" + "z" * (size // 50) + "{% endfor %}"


def filters(rng: random.Random) -> str:
    big = rng.choice(["10**8", "999999999", "2**31", "4194305"])
    return rng.choice([
        f"{{{{ 'a'|center({big}) }}}}", f"{{{{ 'a\\nb'|indent({big}) }}}}", f"{{{{ 'ab'|wordwrap(2)|center({big}) }}}}",
        f"{{{{ ('x' * 1000)|truncate({big}) ~ 'x' * {big} }}}}", f"{{{{ '%0{big}d'|format(1) }}}}",
        f"{{{{ range(100000)|map('string')|join('x' * 100000) }}}}", f"{{{{ ('\\n' * 100000)|indent(100000) }}}}",
        f"{{{{ [('x' * 100000)] * 100000 }}}}", f"{{{{ ('x' * 3000)|replace('', 'y' * 3000) }}}}",
        f"{{{{ range(100000)|list|batch(1)|list|tojson }}}}", f"{{{{ ('x' * 100000)|list|join(' ' * 1000) }}}}",
        f"{{{{ 10 ** {big} }}}}", f"{{{{ (10 ** 1000) ** 1000 }}}}",
    ])


def attributes(rng: random.Random) -> str:
    big = rng.choice(["999999999", "4194305", "100000000"])
    return rng.choice([
        f"{{{{ '{{:>{big}}}'.format(1) }}}}", f"{{{{ '{{0:{big}}}'.format_map({{'0': 1}}) }}}}",
        f"{{{{ ('\\t' * 40000).expandtabs(40000) }}}}", f"{{{{ 'a'.ljust({big}) }}}}", f"{{{{ 'a'.zfill({big}) }}}}",
        f"{{{{ ('x' * 40000).join(['y' * 40000] * 40000) }}}}", f"{{{{ ('{{0}}' * 100000).format('y' * 1000) }}}}",
        f"{{{{ messages[0].content.center({big}) }}}}", f"{{{{ messages.__class__ }}}}",
        f"{{{{ ''.__class__.__mro__[1].__subclasses__() }}}}", f"{{{{ dict(a='x' * 100000).items()|list * 100000 }}}}",
        f"{{{{ namespace(a='b' * 1000000).a * 1000 }}}}", f"{{{{ ('%s' * 100000) % (('x' * 1000,) * 100000) }}}}",
        "{{ cycler(*range(100000)).next() }}{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
    ])


def honest(rng: random.Random) -> str:
    """Growth that stays small: these should render."""
    return rng.choice([
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}",
        "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.content %}{% endfor %}{{ ns.s }}",
        "{% for i in range(1000) %}{{ i }}{% endfor %}",
        "{{ messages|tojson(indent=2) }}", "{{ ('ab' * 1000)|replace('a', 'xyz') }}",
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ n }}{% endif %}{% endmacro %}{{ f(100) }}",
    ])


CLASSES = {"loops": loops, "doubling": doubling, "recursion": recursion, "huge literal": huge_literal,
           "filters": filters, "attributes": attributes, "honest": honest}


def generate(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    names = list(CLASSES)
    cases = []
    for index in range(count):
        name = names[index % len(names)]
        template = CLASSES[name](rng)
        if rng.random() < 0.3:  # mixed with an honest prefix that reads the messages
            template = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content|trim }}\n{% endfor %}" + template
        cases.append((name, template))
    return cases


def memory_mib(field: str) -> float:
    """VmRSS (resident now) or VmHWM (its peak) of this process, in MiB."""
    with open("/proc/self/status") as stream:
        return next(int(line.split()[1]) for line in stream if line.startswith(field + ":")) / 1024


def run_case(template: str) -> tuple[str, float, float, str]:
    """(outcome, seconds, peak memory growth MiB, message) of one render in a forked child."""
    from tuner.data.chat_template import TemplateRefused, bounds, render

    read, write = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        before = memory_mib("VmRSS")
        try:
            render(template, MESSAGES, "chat_template.jinja", True, bos_token="<s>", eos_token="</s>")
            outcome, message = "rendered", ""
        except TemplateRefused as exc:
            outcome, message = "refused", str(exc)
        except BaseException as exc:  # noqa: BLE001: what the campaign counts as a traceback
            outcome, message = "traceback", f"{type(exc).__name__}: {exc}"[:300]
        peak = memory_mib("VmHWM") - before
        os.write(write, f"{outcome}\t{peak:.1f}\t{message[:500]}".encode())
        os._exit(0)
    os.close(write)
    deadline = started + KILL_S
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read)
        return "hang", KILL_S, 0.0, "killed"
    elapsed = time.monotonic() - started
    text = os.read(read, 4096).decode(errors="replace")
    os.close(read)
    outcome, peak, message = (text.split("\t", 2) + ["", "", ""])[:3] if text else ("traceback", "0", "child died")
    if elapsed > bounds().timeout_s + SLACK_S:
        outcome = "hang"
    elif float(peak) > MEMORY_BOUND_MIB:
        outcome = "memory"
    return outcome, elapsed, float(peak), message


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=600)
    parser.add_argument("--seed", type=int, default=48)
    args = parser.parse_args()
    from tuner.data.chat_template import _environment, bounds

    _environment()  # imported and built once, before the forks
    limits = bounds()
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    worst_s, worst_mib, bad = 0.0, 0.0, []
    unnamed = 0
    for index, (name, template) in enumerate(generate(args.cases, args.seed)):
        outcome, seconds, mib, message = run_case(template)
        counts[name][outcome] += 1
        worst_s, worst_mib = max(worst_s, seconds), max(worst_mib, mib)
        if outcome == "refused" and not message.startswith("chat_template.jinja: "):
            unnamed += 1
        if outcome in ("hang", "memory", "traceback"):
            bad.append((index, name, outcome, f"{seconds:.1f} s", f"{mib:.0f} MiB", message[:120], template[:120]))
        print(index, name, outcome, f"{seconds:.2f}s {mib:.0f}MiB", message[:100], flush=True)
    lines = [f"# Hostile chat templates, {datetime.date.today()} (CPU)", "",
             f"`python benchmarks/hostile_templates.py --cases {args.cases} --seed {args.seed}`: {args.cases} templates, "
             f"each rendered on a 4-message conversation in its own forked process; bounds "
             f"TUNER_TEMPLATE_TIMEOUT_S={limits.timeout_s:g} s, TUNER_TEMPLATE_MAX_CHARS={limits.max_chars}; a hang is "
             f"a render past the time bound + {SLACK_S:g} s, memory a peak growth past {MEMORY_BOUND_MIB} MiB.", "",
             "| class | cases | refused | rendered | hang | memory | traceback |", "|---|---|---|---|---|---|---|"]
    for name in CLASSES:
        c = counts[name]
        lines.append(f"| {name} | {sum(c.values())} | {c['refused']} | {c['rendered']} | {c['hang']} | {c['memory']} "
                     f"| {c['traceback']} |")
    total = sum((counts[name] for name in CLASSES), collections.Counter())
    lines.append(f"| **all** | {sum(total.values())} | {total['refused']} | {total['rendered']} | {total['hang']} | "
                 f"{total['memory']} | {total['traceback']} |")
    lines += ["", f"Slowest render {worst_s:.2f} s (bound {limits.timeout_s:g} s); largest peak memory growth "
                  f"{worst_mib:.0f} MiB; refusals not naming the file: {unnamed}.", ""]
    if bad:
        lines += ["| # | class | outcome | time | memory | message | template |", "|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in row) + " |"
                  for row in bad]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"hostile-templates_{datetime.date.today()}_cpu.md"
    out.write_text("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()
