"""docs/launch.md's table of tactic combinations agrees with the rules in tuner/recipe/checks.py."""
from __future__ import annotations

import re

import pytest

from conftest import REPO
from tuner.recipe.io import validate_recipe
from tuner.recipe.overrides import apply_overrides
from tuner.recipe.source import RecipeError, RecipeSource

BASE = {"name": "combo", "hardware": {"gpus_per_machine": 8, "gpu": "H100-80GB"}, "memory": {"mixed_precision": "bf16"}}


def combination_rows() -> list[tuple[str, list[str], str, str | None]]:
    """(combination, --set overrides, yes/no, refused field) for each row of the table."""
    text = (REPO / "docs" / "launch.md").read_text()
    table = text.split("## Which tactics combine", 1)[1]
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        field = re.search(r"\(`([^`]+)`\)", cells[2])
        rows.append((cells[0], cells[1].strip("`").split(), cells[2].split()[0], field.group(1) if field else None))
    return rows


def test_the_table_has_rows():
    verdicts = [row[2] for row in combination_rows()]
    assert verdicts.count("yes") >= 8 and verdicts.count("no") >= 10


@pytest.mark.parametrize("combination, overrides, verdict, field", combination_rows(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_row_agrees_with_the_checks(combination, overrides, verdict, field):
    data = apply_overrides(BASE, overrides, RecipeSource())
    if verdict == "yes":
        validate_recipe(data)
        return
    assert verdict == "no" and field, f"{combination}: a 'no' row names the refused field"
    with pytest.raises(RecipeError) as refused:
        validate_recipe(data)
    assert f"{field}:" in str(refused.value), f"{combination}: refused, but not on {field}: {refused.value}"
