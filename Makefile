# The two README commands: `make quickstart` (the main job) and `make test` (the whole test suite).
# Both create .venv and install legalnb with its dev extras the first time, every package at the version
# requirements.lock pins (torch aside: the variables below pick the build for the machine).
PYTHON ?= python3
TORCH ?= torch==2.13.0
# Where torch comes from. Neither: PyPI (its Linux x86-64 wheel is a CUDA build). TORCH_VARIANT=cpu|cu126|cu128|...:
# PyTorch's index for that build (https://download.pytorch.org/whl/VARIANT), e.g. cu126 for a driver older than the
# default wheel's CUDA. TORCH_INDEX=URL: another index. SYSTEM_TORCH=1: the torch already installed for PYTHON (a
# PyTorch image's): .venv sees PYTHON's site-packages and torch is not installed again. Changing any of them (or
# TORCH) installs again: they are kept in TORCH_CHOICE, which the stamp depends on (.ci/torch_choice.py).
TORCH_VARIANT ?=
TORCH_INDEX ?=
SYSTEM_TORCH ?=
# These four are data, never shell: .ci/torch_choice.py reads them from the environment (exported below) and checks
# each (a variant name, a requirement of torch, an https URL) before anything runs; no recipe line is built from
# them, so a quote or `;` in one (on the command line or from the environment) is refused in one line, make -n
# included. $(value ...): taken as written, so a `$(...)` in one is not expanded by make either.
override TORCH := $(value TORCH)
override TORCH_VARIANT := $(value TORCH_VARIANT)
override TORCH_INDEX := $(value TORCH_INDEX)
override SYSTEM_TORCH := $(value SYSTEM_TORCH)
export TORCH TORCH_VARIANT TORCH_INDEX SYSTEM_TORCH
LOCK  ?= requirements.lock
VENV  ?= .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
WORKDIR ?= quickstart
# pytest processes (pytest-xdist) of `make test`; each test file runs whole in one of them (each notebook of
# tests/test_run_all.py in any one)
TEST_WORKERS ?= 2

.PHONY: install quickstart test test-latest lock sync gpu-check

# Packages are installed without bytecode: Python writes a module's .pyc at its first import, once, so the next
# processes load it. PYTHONDONTWRITEBYTECODE=1 (some shells and CI images set it) would have every process compile
# transformers and torch again (seconds each): make's commands run without it.
unexport PYTHONDONTWRITEBYTECODE

# The torch choice, rewritten only when it changes (so the stamp is remade then, and only then). `+`: it runs under
# make -n and make -q too, so they answer for the choice given (its line holds none of the settings: they come
# from the environment, and a bad one stops make there). With SYSTEM_TORCH=1 it pins the image's torch.
TORCH_CHOICE := $(VENV)/.torch-choice
CHOOSE_TORCH = $(PYTHON) .ci/torch_choice.py --venv $(VENV) --python $(PYTHON)
$(TORCH_CHOICE): FORCE
	+@$(CHOOSE_TORCH) record
FORCE:

# The lock as constraints: every package installed is the version it names; check_lock.py fails the install
# when one is not (a stale lock). `make install LOCK=` installs the newest versions settings.ini's ranges allow.
CONSTRAIN := $(if $(LOCK),-c $(LOCK))
# pip installs pip, uv (both pinned by the lock) and torch (so PIP_FIND_LINKS and pip's config still find it); uv
# installs legalnb and the rest, in a fifth of pip's time. uv keeps the torch pip put in (an installed package that
# meets a requirement stays), but it does not see a venv's system site-packages: with SYSTEM_TORCH=1 pip installs
# the rest too, or uv would download another torch over the image's. uv reads its own index settings (UV_INDEX_URL,
# uv.toml), not pip's. Both leave bytecode out (a minute of CPU for modules never imported): see the top.
UV_INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python
# pip installs TORCH from the chosen index (torch_choice.py pip: it prints the pip command it runs)
PIP_TORCH = $(CHOOSE_TORCH) pip
INSTALL_REST = $(if $(filter 1,$(SYSTEM_TORCH)),$(BIN)/python -m pip install -q,$(UV_INSTALL))
$(STAMP): settings.ini setup.py $(LOCK) $(TORCH_CHOICE)
	$(CHOOSE_TORCH) venv
	$(BIN)/python -m pip install -q $(CONSTRAIN) --upgrade pip uv
	$(if $(filter 1,$(SYSTEM_TORCH)),,$(PIP_TORCH))
	$(INSTALL_REST) $(CONSTRAIN) -c $(TORCH_CHOICE) -e ".[dev]"
	$(if $(LOCK),$(BIN)/python .ci/check_lock.py)
	touch $(STAMP)

install: $(STAMP)

quickstart: $(STAMP)
	$(BIN)/legalnb quickstart --workdir $(WORKDIR)

# Notebooks clean and exported, README in step with index.ipynb, then tests/. The notebooks' tests run once, in
# tests/test_run_all.py: every notebook in a fresh Jupyter kernel, the cells nbdev_test runs (`nbdev_test` runs them
# in-process, e.g. `nbdev_test --path nbs/08_scoring.ipynb` while writing one). One torch thread per process:
# oversubscribed torch threads made a tiny CPU model ten times slower on a 2-core machine. pytest runs the test
# files in TEST_WORKERS processes (--dist loadfile: a file's module fixtures are made once; tests/conftest.py makes
# each notebook of test_run_all.py a unit of its own, so the notebooks spread over the workers); most tests use one
# core, so two take 2 cores.
test: export OMP_NUM_THREADS := 1
test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python .ci/check_sync.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest tests -q -ra --durations=25 -n $(TEST_WORKERS) --dist loadfile

# Drift, caught on our side: a new environment (.venv-latest) with the newest releases settings.ini's ranges allow,
# and the whole test suite on it. A weekly GitHub workflow runs it; what it finds becomes a fix or a tighter range.
# `make test-latest TORCH_VARIANT=cpu` on a machine without a GPU (the workflow's) takes torch's CPU build.
test-latest:
	rm -rf .venv-latest
	$(MAKE) install VENV=.venv-latest LOCK=
	.venv-latest/bin/python .ci/check_lock.py --report
	$(MAKE) test VENV=.venv-latest LOCK=

# Resolve settings.ini's requirements afresh into requirements.lock (uv pip compile) and print what changed (for
# the TORCH exported above, checked by lock.py).
lock: $(STAMP)
	$(BIN)/python .ci/lock.py

# Developer helpers: export the notebooks, clean them, and render README.md from nbs/index.ipynb.
sync: $(STAMP)
	$(BIN)/nbdev_clean && $(BIN)/nbdev_export && $(BIN)/python .ci/render_readme.py

# One GPU, eight minutes: every CUDA path exercised and measured, into gpu-check/report.md and report.json (see
# bench/gpu_check.py). It runs from the checkout with the machine's own Python (no venv, no install, nothing
# downloaded): GPU_PYTHON=.venv/bin/python to use this one; WHEELS=DIR installs carried wheels first (fastcore).
GPU_PYTHON ?= python3
gpu-check:
	PYTHONPATH=. $(GPU_PYTHON) bench/gpu_check.py $(if $(WHEELS),--wheels $(WHEELS)) $(GPU_CHECK_FLAGS)
