# Two commands do everything on a fresh clone:  make train   /   make test
# Each creates .venv (torch==2.13.0 CPU build first, then the project) only when it is missing;
# `make train` installs what training needs, `make test` adds the dev extras (pytest, ruff, mypy, sweeps, SB3, Atari).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: train test lint docs clean-venv

$(BIN)/rl-train: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
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

lint: $(VENV)/.dev-extras
	$(BIN)/ruff check src tests scripts docs
	$(BIN)/mypy

docs: $(VENV)/.dev-extras
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:8000

clean-venv:
	rm -rf $(VENV)
