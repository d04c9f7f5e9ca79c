# The two README commands: `make quickstart` (the main job) and `make test` (the whole test suite).
# Both create .venv and install legalnb with its dev extras the first time.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
WORKDIR ?= quickstart

.PHONY: install quickstart test sync readme clean-notebooks

$(STAMP): settings.ini setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

quickstart: $(STAMP)
	$(BIN)/legalnb quickstart --workdir $(WORKDIR)

# Notebooks clean and exported, README in step with index.ipynb, notebook tests, then tests/.
# One torch thread per process: nbdev_test runs two notebooks at once, and oversubscribed torch threads
# made a tiny CPU model ten times slower on a 2-core machine.
test: export OMP_NUM_THREADS := 1
test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python .ci/check_sync.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/nbdev_test --n_workers 2 --timing
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest tests -q -ra --durations=25

# Developer helpers: export the notebooks, clean them, and render README.md from nbs/index.ipynb.
sync: $(STAMP)
	$(BIN)/nbdev_clean && $(BIN)/nbdev_export && $(BIN)/python .ci/render_readme.py
