# Pitstop: the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP_TRAIN := $(VENV)/.installed-train
STAMP_DEV   := $(VENV)/.installed-dev
PYTEST_WORKERS ?= 4

.PHONY: demo test lint typecheck pytest bench bench-smoke gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

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
	$(BIN)/ruff check bot handlers pipeline devhost tests bench
	$(BIN)/ruff format --check bot handlers pipeline devhost tests bench

typecheck: $(STAMP_DEV)
	$(BIN)/mypy

# three workers (pytest-xdist): many tests wait on windows, not on the CPU; the Slurm tests share one
# worker, so one cluster (tests/fixtures/slurm.py)
pytest: $(STAMP_DEV)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

## make bench: every benchmark under bench/, one summary line each at the end; exits 1 if any
## failed (its output and its summary line name the condition)
bench: $(STAMP_DEV)
	@summary=$$(mktemp); failed=""; load0=$$(cut -d' ' -f1-3 /proc/loadavg); \
	for b in bench/*.py; do \
	  [ "$$b" = bench/benchlib.py ] && continue; \
	  [ "$$b" = bench/gpu_check.py ] && continue; \
	  echo "== $$b"; out=$$(mktemp); \
	  $(BIN)/python $$b > $$out 2>&1; rc=$$?; cat $$out; \
	  if [ $$rc -ne 0 ]; then failed="$$failed $$b"; echo "$$b: FAILED (exit $$rc): $$(tail -n 1 $$out)" >> $$summary; \
	  else tail -n 1 $$out >> $$summary; fi; rm -f $$out; \
	done; \
	gpu=$$(nvidia-smi -L 2>/dev/null | head -n 1); \
	echo; echo "== summary ($$(uname -m), $$(nproc) cores, $${gpu:-no GPU}, load average $$load0 at the start and $$(cut -d' ' -f1-3 /proc/loadavg) at the end, $$(date -u +%Y-%m-%dT%H:%MZ))"; \
	cat $$summary; rm -f $$summary; \
	if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi

## make bench-smoke: every benchmark's quick mode (small sizes, a few seconds each, no speed
## checks); make test runs the same file as part of the suite
bench-smoke: $(STAMP_DEV)
	$(BIN)/python -m pytest -q tests/test_bench_smoke.py

## make gpu-check: on this machine's GPUs, the reference pipeline's full profile for a bounded time,
## a restart with the GPU memory released after each stop, and bench/topk.py on CUDA: one summary
## line; "gpu-check: no GPU" and exit 0 where there is none (GPU_CHECK_S: the run's seconds)
GPU_CHECK_S ?= 120
gpu-check: $(STAMP_DEV)
	$(BIN)/python bench/gpu_check.py --seconds $(GPU_CHECK_S)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
