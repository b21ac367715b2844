"""The recipe library: every built-in recipe validates, renders and fits its stated hardware, states the peak the
planner predicts (kept exact: `make recipe-peaks` rewrites the comments after a planner change), is listed by
family and method with the hardware it needs, and is shown in docs/ecosystem.md."""
from __future__ import annotations

import shutil

import pytest

from conftest import REPO
from tuner.cli import main
from tuner.commands.recipes import hardware_needed
from tuner.recipe.io import load_recipe
from tuner.recipe.registry import builtin_names, builtin_path, family, recipes_dir

REAL_MODELS = ["meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-32B",
               "Qwen/Qwen2.5-72B", "mistralai/Mistral-7B", "google/gemma-2-9b", "microsoft/phi-4",
               "Qwen/Qwen3-8B", "Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B", "google/gemma-3-12b", "openai/gpt-oss-20b"]


@pytest.mark.slow
def test_every_builtin_recipe_validates_fits_and_states_its_predicted_peak(capsys):
    assert main(["recipes", "check"]) == 0, capsys.readouterr().err
    assert f"{len(builtin_names())} of {len(builtin_names())} built-in recipes" in capsys.readouterr().out


def test_the_library_covers_each_model_and_setup():
    recipes = {name: load_recipe(builtin_path(name)) for name in builtin_names() if family(name) != "demo"}
    for model in REAL_MODELS:
        assert any(r.model.id.startswith(model) for r in recipes.values()), f"no recipe for {model}"
    setups = {(r.method.kind, hardware_needed(r), r.memory.zero_stage) for r in recipes.values()}
    assert ("qlora", "1 x RTX4090", None) in setups
    assert ("lora", "1 x A100-80GB", None) in setups
    assert ("full", "8 x H100-80GB", 3) in setups
    assert ("full", "2 machines x 8 x H100-80GB", 3) in setups
    assert any(r.training.max_seq_length >= 16384 for r in recipes.values()), "a long-context recipe"
    for name, recipe in recipes.items():
        assert recipe.name == name.replace("/", "-"), "the run is named after the recipe"


def test_the_library_has_grpo_recipes_for_real_models_on_the_hardware_users_have():
    recipes = [load_recipe(builtin_path(name)) for name in builtin_names() if family(name) != "demo"]
    grpo = {(r.model.id, r.method.kind, hardware_needed(r), r.objective.grpo.generation) for r in recipes
            if r.objective.kind == "grpo"}
    assert grpo == {("Qwen/Qwen3-8B", "lora", "1 x RTX4090", "transformers"),
                    ("Qwen/Qwen3-8B", "full", "8 x H100-80GB", "vllm_colocate"),
                    ("Qwen/Qwen3-30B-A3B", "lora", "1 x H100-80GB", "transformers")}
    for recipe in recipes:  # verifiable rewards: TRL's maths checker on the data's solutions, and the format
        if recipe.objective.kind == "grpo":
            assert [(r.kind, r.column) for r in recipe.objective.grpo.rewards] == [("math", "solution"),
                                                                                  ("think_format", None)]


@pytest.mark.slow
def test_a_stale_peak_is_caught_and_make_recipe_peaks_refreshes_it(tmp_path, monkeypatch, capsys):
    library = tmp_path / "recipes"
    shutil.copytree(recipes_dir(), library)
    monkeypatch.setenv("TUNER_RECIPES_DIR", str(library))
    path = library / "llama3.1" / "8b-qlora.yaml"
    original = path.read_text()
    path.write_text(original.replace("# Predicted peak: ", "# Predicted peak: 1", 1))
    assert main(["recipes", "check"]) == 1
    err = capsys.readouterr().err
    assert "8b-qlora.yaml: the comment says" in err and "make recipe-peaks" in err
    assert main(["recipes", "check", "--write"]) == 0
    assert path.read_text() == original, "only the peak line is rewritten"
    path.write_text(original.replace("micro_batch_size: 2", "micro_batch_size: 8"))
    assert main(["recipes", "check", "--write"]) == 1, "a recipe that no longer fits is not papered over"
    assert "plans to 'does not fit' on 1 x RTX4090" in capsys.readouterr().err


def test_ls_groups_by_family_and_method_with_the_hardware(capsys):
    assert main(["recipes", "ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    groups = [line for line in lines if not line.startswith(" ")]
    assert groups[0] == "demo" and groups[1:] == sorted(groups[1:]) and "llama3.1" in groups
    llama = lines[lines.index("llama3.1") + 1:lines.index(groups[groups.index("llama3.1") + 1])]
    methods = [line.split()[0] for line in llama]
    assert methods == sorted(methods, key=("full", "lora", "qlora").index), "grouped by method"
    row = next(line for line in llama if "llama3.1/70b-full " in line)
    assert row.split()[0] == "full" and "2 machines x 8 x H100-80GB" in row and "Llama 3.1 70B" in row
    assert any(line.split()[:2] == ["full", "demo"] and " CPU " in line for line in lines)


def test_nested_names_work_wherever_a_recipe_is_named(tmp_path, capsys):
    assert main(["validate", "llama3.1/8b-qlora", "-q"]) == 0
    assert main(["plan", "qwen2.5/72b-full", "--json"]) == 0
    assert main(["recipes", "show", "mistral/7b-lora"]) == 0
    assert capsys.readouterr().out.endswith(builtin_path("mistral/7b-lora").read_text()[-200:])
    assert main(["recipes", "cp", "phi4/14b-qlora", str(tmp_path)]) == 0
    assert (tmp_path / "14b-qlora.yaml").read_text() == builtin_path("phi4/14b-qlora").read_text()
    assert main(["recipes", "show", "llama3.1/8b-qlroa"]) == 2
    assert "Did you mean 'llama3.1/8b-qlora'?" in capsys.readouterr().err
    assert main(["recipes", "show", "../pyproject"]) == 2, "names stay inside the recipes folder"


@pytest.mark.parametrize("name", [n for n in builtin_names() if family(n) != "demo"])
def test_every_recipe_renders_its_run_directory(name, tmp_path, capsys):
    assert main(["render", name, "-o", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    recipe = load_recipe(tmp_path / "run" / "recipe.lock.yaml")
    assert (tmp_path / "run" / "deepspeed.json").is_file() == (recipe.memory.distributed == "deepspeed")


def test_docs_show_every_recipe_in_two_lines():
    doc = (REPO / "docs" / "ecosystem.md").read_text()
    for name in builtin_names():
        if family(name) == "demo":
            continue
        first = next((line for line in doc.splitlines() if line.startswith(f"- `{name}`")), None)
        assert first, f"docs/ecosystem.md does not list {name}"
        assert hardware_needed(load_recipe(builtin_path(name))) in first
