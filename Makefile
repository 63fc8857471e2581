# Two commands do everything on a fresh clone:  make train   /   make test
# Each creates .venv (torch 2.13.0's CPU build first, then the project) only when it is missing;
# `make train` installs what training needs, `make test` adds the dev extras (pytest, ruff, mypy, sweeps, SB3, Atari).
# TORCH picks torch's build (scripts/install_torch.py): cpu (default; PyTorch's CPU wheel index, about 200 MB, or
# where that index is unreachable the plain name from pip's own settings if that is a CPU build too),
# cu126 / cu128 / ... (that CUDA build, several GB), pypi (the plain name, whatever pip's index gives).
# It applies when .venv is created: for another build on an existing .venv, `make clean-venv` first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=
TORCH  ?= cpu
TORCH_VERSION ?= 2.13.0

.PHONY: train test quick lint docs docs-build clean-venv

$(BIN)/rl-train: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python scripts/install_torch.py --build $(TORCH) --version $(TORCH_VERSION)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.dev-extras: $(BIN)/rl-train pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

train: $(BIN)/rl-train
	$(BIN)/rl-train algo=ppo env=CartPole-v1 $(ARGS)
	@echo "rlcli is installed in $(VENV): run '. $(VENV)/bin/activate' once per shell, then rl-train, rl-eval and rl-report work as the README shows"

test: $(VENV)/.dev-extras
	$(BIN)/ruff check src tests scripts docs
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2 tests

# A contributor's quick check: ruff, mypy and the unit tests of each module's logic (buffers, returns, losses,
# heads, schedules, the registry, configs, the layering; no learning runs, no rl-train processes). `make test` is
# the whole suite, which CI runs.
QUICK_TESTS := $(addprefix tests/test_,$(addsuffix .py,build_once configs entropy exploration gae heads her \
	isa_probe layout members_loss offpolicy_math ppo_losses r2d2 recurrent registry replay rl_zoo_translation rnd \
	schedules_and_pg stacked_step tuning))

quick: $(VENV)/.dev-extras
	$(BIN)/ruff check src tests scripts docs
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2 -m "not slow" $(QUICK_TESTS)

lint: $(VENV)/.dev-extras
	$(BIN)/ruff check src tests scripts docs
	$(BIN)/mypy

docs: $(VENV)/.dev-extras
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:8000

# the site into site/, strictly (every link and reference resolved), without Material's end-of-life banner
docs-build: $(VENV)/.dev-extras
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean-venv:
	rm -rf $(VENV)
