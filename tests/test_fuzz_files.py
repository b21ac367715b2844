"""Property-based fuzzing of the files tuner reads back from a run: a saved model's config.json, its tokenizer files
and chat template, safetensors headers, an adapter's files, a checkpoint's metadata, the run lock.

Each case damages one file of a whole folder (cut short, bits flipped, bytes spliced in, emptied, replaced with
garbage, or one JSON value swapped for a random one; a safetensors header rewritten with random shapes, dtypes and
offsets) and runs what tuner does with that folder: for a model, the pre-load file checks, loading with
``device_map="auto"``, one prompt through the chat template and two generated tokens (what ``tuner infer`` does
before it prints); for a checkpoint, ``resume: auto`` and the checkpoint named explicitly (what ``tuner run
--resume`` and every rank do); for a lock, taking and releasing it.  Every case must end in a result or in one of
the errors tuner prints as one message (RecipeError, DataError, ModelLoadError, RunLocked), never another
exception; a few cases of each model class go through the real ``tuner infer`` command line too.

``TUNER_FUZZ_FILES`` sets the examples per property (default 30, what CI runs); the total tried is printed at the
end and kept in pytest's cache (``pytest --cache-show tuner/fuzz-files``).
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import struct
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tuner.cli import main, user_errors

pytestmark = pytest.mark.xdist_group("fuzz-files")  # one worker, in order: the last test reports the count

EXAMPLES = int(os.environ.get("TUNER_FUZZ_FILES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
CASES: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30, -10**30]),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
    st.sampled_from(["", "LORA", "llama", "bogus", "float16", "F32", "\u0000", "{{ 1/0 }}", "../../etc/passwd"]),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda children: st.one_of(st.lists(children, max_size=4),
                                             st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=10)
TEMPLATE_SNIPPETS = st.sampled_from([
    "{% if %}", "{{ x", "{% for m in messages %}", "{{ messages[99]['content'] }}", "{{ 1 / 0 }}",
    "{{ raise_exception('no') }}", "{% endfor %}", "{{ messages|length + 'a' }}", "{{ ''.__class__ }}", "{#",
    "{% set x = x %}{{ x }}", "{{ undefined_name.attr }}",
])


def json_paths(value, prefix=()):
    """Every place in a JSON value (up to three levels deep) a mutation may change."""
    yield prefix
    if len(prefix) < 3 and isinstance(value, dict):
        for key, item in value.items():
            yield from json_paths(item, (*prefix, key))
    elif len(prefix) < 3 and isinstance(value, list):
        for index, item in enumerate(value[:8]):
            yield from json_paths(item, (*prefix, index))


@st.composite
def mutated_json(draw, original):
    """``original`` (a parsed JSON value) with one place set to a random value, or removed."""
    data = copy.deepcopy(original)
    path = draw(st.sampled_from(list(json_paths(data))))
    if not path:
        return draw(JSON_VALUES)
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    if isinstance(parent, dict) and draw(st.booleans()) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(JSON_VALUES)
    return data


@st.composite
def damaged_bytes(draw, original: bytes) -> bytes:
    how = draw(st.sampled_from(["cut", "flip", "splice", "empty", "garbage", "json", "json", "json"]))
    if how == "cut":
        return original[:draw(st.integers(0, max(len(original) - 1, 0)))]
    if how == "flip":
        data = bytearray(original)
        for _ in range(draw(st.integers(1, 8))):
            if data:
                data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    if how == "splice":
        at = draw(st.integers(0, len(original)))
        return original[:at] + draw(st.binary(min_size=1, max_size=64)) + original[at:]
    if how == "empty":
        return b""
    if how == "garbage":
        return draw(st.binary(max_size=512))
    try:
        parsed = json.loads(original)
    except ValueError:
        return draw(st.binary(max_size=512))
    return json.dumps(draw(mutated_json(parsed))).encode()


@st.composite
def damaged_safetensors(draw, original: bytes) -> bytes:
    """A header rewritten (random shapes, dtypes, offsets, metadata; the length prefix may lie), or the bytes damaged."""
    if draw(st.integers(0, 3)) == 0:
        return draw(damaged_bytes(original))
    (length,) = struct.unpack("<Q", original[:8])
    header, data = json.loads(original[8:8 + length]), original[8 + length:]
    names = [name for name in header if name != "__metadata__"]
    for _ in range(draw(st.integers(1, 3))):
        entry = header[draw(st.sampled_from(names))]
        if not isinstance(entry, dict):  # replaced by an earlier round
            continue
        field = draw(st.sampled_from(["shape", "dtype", "data_offsets", "entry"]))
        if field == "shape":
            entry["shape"] = draw(st.one_of(st.lists(st.integers(-2, 10**6), max_size=4), JSON_VALUES))
        elif field == "dtype":
            entry["dtype"] = draw(st.one_of(st.sampled_from(["F32", "F16", "BF16", "I64", "BOOL", "F8_E4M3", "X"]),
                                            JSON_VALUES))
        elif field == "data_offsets":
            entry["data_offsets"] = draw(st.one_of(st.lists(st.integers(-10, len(data) + 10), min_size=2,
                                                            max_size=2), JSON_VALUES))
        else:
            header[draw(st.sampled_from(names))] = draw(JSON_VALUES)
    text = json.dumps(header).encode()
    prefix = len(text) + draw(st.sampled_from([0, 0, 0, -1, 1, 2**40]))
    return struct.pack("<Q", max(prefix, 0)) + text + data


# -- the folders, and what tuner does with them ----------------------------------------------------------------

@pytest.fixture(scope="module")
def folders(tmp_path_factory, demo_model_path):
    """A full model folder, a LoRA adapter folder for the demo model, and a complete checkpoint of a run."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuner.rundir.checkpoints import resume_settings
    from tuner.rundir.integrity import saved_files
    from tuner.recipe.io import load_recipe, recipe_to_yaml
    from tuner.recipe.registry import builtin_path
    from tuner.render.run_directory import write_run_directory
    from tuner.rundir.layout import CHECKPOINT_INFO, CHECKPOINTS_DIR, LOCK_FILE

    root = tmp_path_factory.mktemp("fuzz-files")
    model = root / "model"
    shutil.copytree(demo_model_path, model)
    adapter = root / "adapter"
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(demo_model_path),
                                LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    peft_model.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(demo_model_path).save_pretrained(adapter)
    recipe = load_recipe(builtin_path("demo"), [f"output.dir={root / 'run'}"])
    run = write_run_directory(recipe)
    checkpoint = run / CHECKPOINTS_DIR / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    shutil.copyfile(model / "model.safetensors", checkpoint / "model.safetensors")
    state = {"global_step": 4, "epoch": 0.1, "log_history": [{"loss": 2.5, "step": 2}, {"loss": 2.1, "step": 4}],
             "best_metric": None, "is_world_process_zero": True}
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 1}, "weight_map": {"model.embed_tokens.weight": "model.safetensors"}}))
    (checkpoint / LOCK_FILE).write_text(recipe_to_yaml(recipe))
    (checkpoint / CHECKPOINT_INFO).write_text(json.dumps(
        {"step": 4, "settings": resume_settings(recipe, 1), "files": saved_files(checkpoint)[0]}))
    return {"model": model, "adapter": adapter, "run": run, "checkpoint": checkpoint}


@contextlib.contextmanager
def damaged_copy(folder: Path, name: str, content: bytes):
    with tempfile.TemporaryDirectory() as scratch:
        copied = Path(scratch) / folder.name
        shutil.copytree(folder, copied)
        (copied / name).write_bytes(content)
        yield copied


def clean_outcome(kind: str, action) -> None:
    """``action()`` ends in a result or one of the errors tuner prints as one message; anything else fails."""
    try:
        action()
        OUTCOMES[f"{kind}: ran to the end"] += 1
    except user_errors() as exc:
        assert str(exc).strip() and "Traceback" not in str(exc)
        OUTCOMES[f"{kind}: one message"] += 1


def infer_steps(model_path: Path, adapter: Path | None = None) -> None:
    """What `tuner infer --prompt` does before printing: resolve (file checks, remote code), load and place,
    render one prompt, check it fits, generate two tokens."""
    from tuner.infer.generate import GENERATION_FAILURES, check_prompt_fits, generate_answers, render_prompt
    from tuner.infer.load import load_for_inference
    from tuner.infer.target import resolve_target
    from tuner.loading.model import ModelLoadError

    target = resolve_target(model=str(model_path), adapter=str(adapter) if adapter else None)
    loaded = load_for_inference(target, context=64, max_memory={"cpu": "2GiB"})
    prompt = render_prompt(loaded.tokenizer, [{"role": "user", "content": "reverse\nabc"}], target.recipe.data.format)
    check_prompt_fits(loaded.tokenizer, loaded.model, prompt, 2)
    try:
        generate_answers(loaded.model, loaded.tokenizer, [prompt], max_new_tokens=2)
    except GENERATION_FAILURES as exc:  # tuner infer reports these as one message (commands/infer.py)
        raise ModelLoadError(f"generation failed: {exc}") from None


def quiet(action):
    def run():
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            action()
    return run


MODEL_FILES = ["config.json", "generation_config.json"]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


@FUZZ
@given(data=st.data(), name=st.sampled_from(MODEL_FILES))
def test_damaged_model_config(folders, data, name) -> None:
    CASES["model config.json / generation_config.json"] += 1
    original = (folders["model"] / name).read_bytes()
    with damaged_copy(folders["model"], name, data.draw(damaged_bytes(original))) as model:
        clean_outcome("model config", quiet(lambda: infer_steps(model)))


@FUZZ
@given(data=st.data(), name=st.sampled_from(TOKENIZER_FILES))
def test_damaged_tokenizer_files(folders, data, name) -> None:
    CASES["tokenizer files and chat template"] += 1
    original = (folders["model"] / name).read_bytes()
    if name.endswith(".jinja") and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(original)))
        content = original[:at] + data.draw(TEMPLATE_SNIPPETS).encode() + original[at:]
    else:
        content = data.draw(damaged_bytes(original))
    with damaged_copy(folders["model"], name, content) as model:
        clean_outcome("tokenizer", quiet(lambda: infer_steps(model)))


@FUZZ
@given(data=st.data())
def test_damaged_safetensors_headers(folders, data) -> None:
    CASES["safetensors headers"] += 1
    original = (folders["model"] / "model.safetensors").read_bytes()
    with damaged_copy(folders["model"], "model.safetensors", data.draw(damaged_safetensors(original))) as model:
        clean_outcome("safetensors", quiet(lambda: infer_steps(model)))


@FUZZ
@given(data=st.data(), name=st.sampled_from(["adapter_config.json", "adapter_model.safetensors"]))
def test_damaged_adapter_files(folders, data, name) -> None:
    CASES["adapter files"] += 1
    original = (folders["adapter"] / name).read_bytes()
    damage = damaged_safetensors if name.endswith(".safetensors") else damaged_bytes
    with damaged_copy(folders["adapter"], name, data.draw(damage(original))) as adapter:
        clean_outcome("adapter", quiet(lambda: infer_steps(folders["model"], adapter)))


@FUZZ
@given(data=st.data(), name=st.sampled_from(["tuner_checkpoint.json", "trainer_state.json",
                                             "model.safetensors.index.json", "model.safetensors"]))
def test_damaged_checkpoint_metadata(folders, data, name) -> None:
    """`tuner run --resume` (auto: the damaged checkpoint is skipped, or resumed when still whole) and the
    checkpoint named explicitly (refused with one message when damaged), before launch as on every rank."""
    from tuner.rundir.checkpoints import checkpoint_states, resume_checkpoint
    from tuner.recipe.io import load_recipe

    CASES["checkpoint metadata"] += 1
    original = (folders["checkpoint"] / name).read_bytes()
    damage = damaged_safetensors if name.endswith(".safetensors") else damaged_bytes
    with tempfile.TemporaryDirectory() as scratch:
        run = Path(scratch) / "run"
        shutil.copytree(folders["run"], run)
        checkpoint = run / "checkpoints" / "checkpoint-4"
        (checkpoint / name).write_bytes(data.draw(damage(original)))
        recipe = load_recipe(run / "recipe.lock.yaml", [f"output.dir={run}"])
        states = list(checkpoint_states(run / "checkpoints"))
        assert len(states) == 1 and (states[0][1] is None or states[0][1].strip())
        for resume in ("auto", str(checkpoint)):
            resumed = recipe.model_copy(update={"training": recipe.training.model_copy(update={"resume": resume})})
            clean_outcome(f"checkpoint ({'auto' if resume == 'auto' else 'named'})",
                          quiet(lambda resumed=resumed: resume_checkpoint(resumed, run, 1)))


@FUZZ
@given(data=st.data())
@example(data=None)  # a lock that is a pipe: refused at once, never read
def test_damaged_lock_files(folders, data, tmp_path_factory) -> None:
    import psutil

    from tuner.rundir.lock import RunLock, lock_path

    CASES["lock files"] += 1
    run = tmp_path_factory.mktemp("lock") / "run"
    path = lock_path(run)
    if data is None:
        os.mkfifo(path)
    else:
        me = psutil.Process(os.getppid())  # a live process that is not this one
        valid = json.dumps({"pid": me.pid, "host": os.uname().nodename, "started": me.create_time()}).encode()
        path.write_bytes(data.draw(damaged_bytes(valid)))

    def take() -> None:
        with RunLock(run):
            pass

    clean_outcome("lock", take)


CLI_CLASSES = {"config.json": "model", "tokenizer.json": "model", "chat_template.jinja": "model",
               "model.safetensors": "model", "adapter_config.json": "adapter"}


@settings(FUZZ, max_examples=max(5, EXAMPLES // 10))
@given(data=st.data(), name=st.sampled_from(sorted(CLI_CLASSES)))
def test_damaged_files_through_tuner_infer(folders, data, name) -> None:
    """The same damage through the real command line: exit 0, or 1/2 with one `error:` line, no traceback."""
    CASES["through tuner infer"] += 1
    kind = CLI_CLASSES[name]
    original = (folders[kind] / name).read_bytes()
    damage = damaged_safetensors if name.endswith(".safetensors") else damaged_bytes
    with damaged_copy(folders[kind], name, data.draw(damage(original))) as damaged:
        model, adapter = (damaged, None) if kind == "model" else (folders["model"], damaged)
        args = ["infer", "--model", str(model), "--prompt", "reverse\nabc", "--greedy", "--max-new-tokens", "2"]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(args + (["--adapter", str(adapter)] if adapter else []))
    err = err.getvalue()
    assert code in (0, 1, 2) and "Traceback" not in err, err
    if code:
        assert len([line for line in err.splitlines() if line.startswith("error: ")]) == 1, err


def test_zz_report_file_case_count(request, capsys) -> None:
    """Runs last in its group: how many cases the properties above tried, and how they ended."""
    total = sum(CASES.values())
    if not total:
        pytest.skip("run with the file fuzz tests to count their cases")
    request.config.cache.set("tuner/fuzz-files", {"total": total, **CASES, **OUTCOMES})
    with capsys.disabled():
        print(f"\nfile fuzz cases tried: {total} ({', '.join(f'{k}: {v}' for k, v in (CASES + OUTCOMES).items())})")
    assert total >= 6 * EXAMPLES
