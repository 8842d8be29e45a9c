# The two ways in: `make demo` runs the pipeline on the local lab; `make test` runs the suite.
VENV := .venv
BIN := $(VENV)/bin

# The venv is ready once scripts/setup.sh, as its last step, has checked that `fab` runs and
# written this stamp: an interrupted setup leaves none, and the next make resumes it.
READY := $(VENV)/.setup-complete

.PHONY: setup demo test test-fast test-shuffled lint mutation clean
setup: $(READY)

$(READY): pyproject.toml scripts/setup.sh
	scripts/setup.sh

demo: setup
	$(BIN)/python -m dflash_lab.demo

# Parallel workers (pytest-xdist): most of a test's time is spent waiting on sshd hosts and
# remote harness runs, so more workers than cores pays. --dist loadfile keeps a module on one
# worker (its module-scoped lab is built once); each worker that runs e2e_lab tests builds
# its own shared e2e lab (a session fixture is per worker), which also spreads them out; the
# modules of a lab few modules share go to one worker (SAME_WORKER in tests/conftest.py).
# --no-loadscope-reorder keeps the collection's order: modules marked long, longest first.
# 5, not 4: a 4-worker run kept the 2 cores about half busy (15.8 CPU-min in 16.4 min). A
# cold 5-worker run now keeps them 95 % busy (1763 CPU-s in 925 s): more workers gain nothing.
WORKERS ?= 5
PARALLEL := -n $(WORKERS) --dist loadfile --no-loadscope-reorder

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest $(PARALLEL) --durations=15

# For contributors: the unit tier alone (no sshd, no lab), under 2 minutes on 2 cores. It
# computes rather than waits: one worker per core. Modules that compute for tens of seconds or
# more (the statistical T > 0 tests, the benchmarks' smoke runs) are tests/long: `test` runs them.
test-fast: setup
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder tests/unit

# The whole suite in a shuffled order (SEED=n repeats one): order dependence shows.
SEED ?= $(shell date +%s)
test-shuffled: setup
	$(BIN)/python -m pytest $(PARALLEL) --shuffle $(SEED)

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# Not part of `test`/CI: which behaviour of the number- and data-critical modules no fast test
# pins down (scripts/mutation.py; equivalent mutants in scripts/mutation-equivalents.yaml).
mutation: setup
	$(BIN)/python scripts/mutation.py --fail-under 90

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
