"""A model's chat template is outside input: every place tuner renders one (tuner.data.chat_template) stops it at a
time and a size bound, with one message naming its file, and renders honest templates exactly as transformers does."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_export import lora_run
from tuner.data.chat_template import (MAX_CHARS_ENV, TIMEOUT_ENV, TemplateRefused, bounds, chat_ids, render,
                                      render_chat)
from tuner.data.formats import DEFAULT_CHAT_TEMPLATE, INSTRUCTION_CHAT_TEMPLATE, TEXT_CHAT_TEMPLATE, chat_segments
from tuner.rundir.layout import FINAL_DIR

DOUBLING = ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
            "{{ ns.s }}")
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
QUICK = {TIMEOUT_ENV: "1"}  # a spinning template is stopped after a second instead of five
HELLO = [{"role": "user", "content": "reverse\nabc"}]


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "1")


def model_with_template(tmp_path: Path, demo_model_path: Path, template: str, where: str) -> Path:
    """The demo model, its chat template replaced: in chat_template.jinja, or in tokenizer_config.json alone."""
    folder = tmp_path / "model"
    folder.mkdir()
    for path in demo_model_path.iterdir():
        if path.name not in ("chat_template.jinja", "tokenizer_config.json"):
            (folder / path.name).symlink_to(path)
    settings_ = json.loads((demo_model_path / "tokenizer_config.json").read_text())
    if where == "chat_template.jinja":
        (folder / "chat_template.jinja").write_text(template)
    else:
        settings_["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(settings_))
    return folder


# -- the reproductions of issue #48, through the CLI -------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
@pytest.mark.parametrize("template, bound", [(DOUBLING, MAX_CHARS_ENV), (NESTED_LOOPS, TIMEOUT_ENV)],
                         ids=["doubling", "nested-loops"])
def test_infer_refuses_a_template_past_its_bound_naming_the_file(tmp_path, demo_model_path, tuner_cli, where,
                                                                 template, bound):
    model = model_with_template(tmp_path, demo_model_path, template, where)
    result = tuner_cli("infer", "--model", str(model), "--prompt", "hi", "--max-new-tokens", "2", env=QUICK,
                       timeout=120)
    assert result.returncode == 2, result.stderr
    assert str(model / where) in result.stderr and bound in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_chat_and_ollama_export_refuse_a_spinning_template(tmp_path, demo_model_path, tuner_cli):
    model = model_with_template(tmp_path, demo_model_path, NESTED_LOOPS, "chat_template.jinja")
    chat = tuner_cli("chat", "--model", str(model), "--max-new-tokens", "2", input="hi\n", env=QUICK, timeout=120)
    assert chat.returncode == 2 and TIMEOUT_ENV in chat.stderr and "chat_template.jinja" in chat.stderr, chat.stderr
    run = lora_run(tmp_path, demo_model_path)  # export takes a run directory
    template = run / FINAL_DIR / "chat_template.jinja"
    template.write_text(NESTED_LOOPS)
    export = tuner_cli("export", str(run), "--format", "ollama", "--quant", "f16", env=QUICK, timeout=300)
    assert export.returncode == 2, export.stderr
    assert TIMEOUT_ENV in export.stderr and str(template) in export.stderr
    assert not (run / "export").exists()  # refused before anything is written


def test_training_data_formatting_is_bounded(quick):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0}, unk_token="a")),
                                        eos_token="a")
    tokenizer.chat_template = NESTED_LOOPS
    with pytest.raises(TemplateRefused, match=TIMEOUT_ENV):
        chat_segments([*HELLO, {"role": "assistant", "content": "cba"}], tokenizer)


@pytest.mark.parametrize("data_format", ["preference", "unpaired_preference"])
def test_dpo_and_kto_rows_are_rendered_within_bounds_before_trl_renders_them(quick, data_format):
    """TRL's trainers call apply_chat_template themselves: every conversational row is rendered first through the
    bounded renderer, so a spinning template is refused, naming its bound, before TRL starts."""
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    from tuner.data.preference import render_rows_within_bounds

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0}, unk_token="a")),
                                        eos_token="a")
    answer = [{"role": "assistant", "content": "cba"}]
    row = ({"prompt": HELLO, "chosen": answer, "rejected": answer} if data_format == "preference"
           else {"prompt": HELLO, "completion": answer, "label": True})
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    render_rows_within_bounds([row, row], data_format, tokenizer)  # an honest template passes
    tokenizer.chat_template = NESTED_LOOPS
    with pytest.raises(TemplateRefused, match=TIMEOUT_ENV):
        render_rows_within_bounds([row], data_format, tokenizer)


def test_a_bad_bound_in_the_environment_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv(MAX_CHARS_ENV, "lots")
    with pytest.raises(TemplateRefused, match=MAX_CHARS_ENV):
        bounds()


# -- the class: templates that spin or grow, generated ------------------------------------------------------------

GROWERS = [  # one step that at least doubles s or l (text, and a list whose text doubles), shown at the end
    "{% set ns.s = ns.s + ns.s %}", "{% set ns.s = ns.s ~ ns.s %}", "{% set ns.s = ns.s * 2 %}",
    "{% set ns.s = [ns.s, ns.s]|join %}", "{% set ns.s = ns.s|replace('a', 'aa') %}",
    "{% set ns.s = '%s%s' % (ns.s, ns.s) %}", "{% set ns.s = '{0}{0}'.format(ns.s) %}",
    "{% set ns.s = ns.s.replace('a', 'aa') %}", "{% set ns.l = ns.l + ns.l %}", "{% set ns.l = [ns.l, ns.l] %}",
    "{% set ns.s = (ns.s|indent(2, true)) ~ ns.s %}", "{% set ns.s = ns.s|center(ns.s|length * 2) %}",
]
SPINNERS = [  # loops that take forever without growing anything
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
    "{% for i in [0]*100000 %}{% for j in [0]*100000 %}{% if i == j %}{% endif %}{% endfor %}{% endfor %}",
    "{% macro f() %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endmacro %}"
    "{{ f() }}",
    "{% for i in range(100000) %}{% for j in range(100000)|list %}{% endfor %}{% endfor %}",
    "{% for m in messages * 100000 %}{% for j in range(100000) %}{{ j|string|length }}{% endfor %}{% endfor %}",
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(GROWERS), min_size=1, max_size=3), repeat=st.integers(30, 60),
       show=st.sampled_from(["{{ ns.s }}{{ ns.l }}", "{{ (ns.s ~ ns.l)|length }}", "{{ ns|string }}"]),
       inside_macro=st.booleans())
def test_growing_templates_are_refused_within_the_size_bound(quick, steps, repeat, show, inside_macro):
    body = f"{{% for i in range({repeat}) %}}{''.join(steps)}{{% endfor %}}{show}"
    if inside_macro:
        body = f"{{% macro grow() %}}{body}{{% endmacro %}}{{{{ grow() }}}}"
    template = "{% set ns = namespace(s='ab', l=['ab']) %}" + body
    with pytest.raises(TemplateRefused, match="chat_template.jinja: the chat template was stopped"):
        render(template, HELLO, "chat_template.jinja")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spinner=st.sampled_from(SPINNERS), prefix=st.sampled_from(["", "{{ messages[0]['content'] }}"]))
def test_spinning_templates_are_stopped_at_the_time_bound(quick, spinner, prefix):
    with pytest.raises(TemplateRefused, match=TIMEOUT_ENV):
        render(prefix + spinner, HELLO, "chat_template.jinja")


# -- honest templates: the same text as transformers ---------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
CONVERSATIONS = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                                "content": TEXT}), min_size=1, max_size=5)
TEMPLATES = [DEFAULT_CHAT_TEMPLATE, INSTRUCTION_CHAT_TEMPLATE, TEXT_CHAT_TEMPLATE,
             "{{ bos_token }}{% for m in messages %}{{ m.role|upper ~ ': ' ~ m.content|trim }}{% if not loop.last %}"
             "\n{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '%s' % 'ASSISTANT:' }}{% endif %}",
             "{% for m in messages %}{% generation %}{{ m.content|tojson }}{% endgeneration %}{% endfor %}"
             "{{ raise_exception('x') if messages|length > 99 else '' }}{{ dict(a=1)|tojson }}"]


@pytest.fixture(scope="module")
def demo_tokenizer(demo_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=CONVERSATIONS, template=st.sampled_from([None, *TEMPLATES]), generation=st.booleans())
def test_honest_templates_render_as_transformers_renders_them(demo_tokenizer, messages, template, generation):
    expected = demo_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation,
                                                  chat_template=template)
    assert render_chat(demo_tokenizer, messages, template, add_generation_prompt=generation) == expected
    ids = demo_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                             add_generation_prompt=generation, chat_template=template)["input_ids"]
    assert chat_ids(demo_tokenizer, messages, template, add_generation_prompt=generation) == list(ids)


def test_the_bounds_default_and_come_from_the_environment(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    monkeypatch.setenv(MAX_CHARS_ENV, "100")
    assert bounds().max_chars == 100 and bounds().timeout_s == 5.0
    with pytest.raises(TemplateRefused, match=f"100 characters.*{MAX_CHARS_ENV}"):
        render("{{ 'x' * 101 }}", HELLO, "chat_template.jinja")
    assert render("{{ 'x' * 100 }}", HELLO, "chat_template.jinja") == "x" * 100
