# Pitstop: the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP_TRAIN := $(VENV)/.installed-train
STAMP_DEV   := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck pytest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_TRAIN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[train]'
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,train]'
	touch $@ $(STAMP_TRAIN)

## make demo: restart a real training pipeline over SSH with the top-k patch, in the console
demo: $(STAMP_TRAIN)
	$(BIN)/pitstop demo

## make test: lint, type-check, then the whole test suite
test: $(STAMP_DEV) lint typecheck pytest

lint: $(STAMP_DEV)
	$(BIN)/ruff check bot handlers pipeline tests bench
	$(BIN)/ruff format --check bot handlers pipeline tests bench

typecheck: $(STAMP_DEV)
	$(BIN)/mypy

pytest: $(STAMP_DEV)
	$(BIN)/python -m pytest -q

## make bench: every benchmark under bench/, one summary line each at the end
bench: $(STAMP_DEV)
	@summary=$$(mktemp); \
	for b in bench/*.py; do \
	  echo "== $$b"; out=$$(mktemp); \
	  $(BIN)/python $$b > $$out 2>&1; rc=$$?; cat $$out; \
	  if [ $$rc -ne 0 ]; then rm -f $$out $$summary; exit $$rc; fi; \
	  tail -n 1 $$out >> $$summary; rm -f $$out; \
	done; \
	echo; echo "== summary"; cat $$summary; rm -f $$summary

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
