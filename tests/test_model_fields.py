"""Every recipe field that names a model (model.id, objective.teacher, a GRPO reward model): a model planning cannot
read is refused naming that field, never another, with exit 2 and nothing written."""
from __future__ import annotations

import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.cli import main
from tuner.recipe.registry import builtin_path

# field -> (the built-in recipe it is tried in, how to set it in that recipe's mapping)
MODEL_FIELDS = {
    "model.id": ("demo", lambda data, value: data["model"].update(id=value)),
    "objective.teacher": ("demo-distill", lambda data, value: data["objective"].update(teacher=value)),
    "objective.grpo.rewards.1.model": ("demo-grpo", lambda data, value: (  # on the demo model, not the sft run
        data["model"].update(id="builtin:demo"), data["objective"]["grpo"]["rewards"].append(
            {"kind": "model", "model": value}))),
}
MISSING = st.sampled_from(["./no-such-model", "runs/never/final", "/no/such/model/folder", "a/b/c"])


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(MODEL_FIELDS)), missing=MISSING, command=st.sampled_from(["plan", "run"]))
def test_a_model_that_is_not_there_is_refused_at_the_field_that_names_it(tmp_path_factory, capsys, field, missing,
                                                                           command):
    folder = tmp_path_factory.mktemp("recipe")
    recipe_name, put = MODEL_FIELDS[field]
    data = yaml.safe_load(builtin_path(recipe_name).read_text())
    put(data, missing)
    data["output"] = {"dir": str(folder / "run")}
    (folder / "recipe.yaml").write_text(yaml.safe_dump(data))
    previous = os.getcwd()
    os.chdir(folder)
    try:
        code = main([command, "recipe.yaml", *(["--dry-run"] if command == "run" else [])])
    finally:
        os.chdir(previous)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: {field}: {missing}: no such directory; point it at a folder"), err
    assert "Traceback" not in err and not (folder / "run").exists()

