# The two ways in: `make demo` runs the pipeline on the local lab; `make test` runs the suite.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint clean
setup: $(BIN)/fab

$(BIN)/fab: pyproject.toml scripts/setup.sh
	scripts/setup.sh
	touch $@

demo: setup
	$(BIN)/python -m dflash_lab.demo

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
