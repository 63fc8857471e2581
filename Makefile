# Two commands do everything on a fresh clone:  make train   /   make test
# Each creates .venv (torch==2.13.0 CPU build first, then the project) only when it is missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: train test lint clean-venv

$(BIN)/rl-train: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

train: $(BIN)/rl-train
	$(BIN)/rl-train algo=ppo env=CartPole-v1 $(ARGS)

test: $(BIN)/rl-train
	$(BIN)/ruff check src tests scripts
	$(BIN)/mypy
	$(BIN)/python -m pytest -q tests

lint: $(BIN)/rl-train
	$(BIN)/ruff check src tests scripts
	$(BIN)/mypy

clean-venv:
	rm -rf $(VENV)
