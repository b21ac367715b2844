# Two commands for a newcomer:  `make demo`  and  `make test`  (see README.md).
VENV ?= .venv
PYTHON ?= python3
# Used only when the environment has no torch yet. On Linux x86_64 PyPI's torch==2.13.0 is a CUDA
# build; a machine that carries a local CPU wheel of it takes that. To choose a build yourself,
# install torch into $(VENV) first (tuner keeps whatever torch it finds), or override TORCH_SPEC.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tuner-installed

.PHONY: install demo test test-fast docs recipe-peaks inventories constraints clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tuner demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup

# The inner loop while editing (under 3 minutes on 2 cores): everything but the tests marked slow (pyproject says which).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow"

docs: $(STAMP)
	$(PY) -m tuner.recipe.docs > docs/recipes.md

# After a catalog change (tuner/catalog/models.json) or a transformers upgrade: rebuild the shipped parameter
# inventories on the meta device (tests/test_catalog_models.py holds them to a fresh build).
inventories: $(STAMP)
	$(PY) -m tuner.catalog.ship

# After a planner change: rewrite the "# Predicted peak:" comment of every built-in recipe from the plan.
recipe-peaks: $(STAMP)
	$(VENV)/bin/tuner recipes check --write

# After upgrading a dependency in $(VENV) and a green `make test`: pin what passed (constraints.txt's header says why).
constraints: $(STAMP)
	{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -vE '^(torch|sympy|mpmath|networkx)=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) runs
