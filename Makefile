# Two entry points: `make run` (the console on a demo kernel DB) and `make test`.
# Everything installs into .venv from this project's own pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HEADERS := $(VENV)/.headers

.PHONY: run test bench-smoke fuzz lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[tvm,dev]'
	touch $(STAMP)

# The cuDNN/cuBLAS headers the network zoo's compile check needs (tests/test_zoo.py); only `make test` installs them.
$(HEADERS): $(STAMP)
	$(BIN)/pip install -q -e '.[headers]'
	touch $(HEADERS)

run: $(STAMP)
	$(BIN)/kdb console --demo

# One pytest run over every core (pytest-xdist; work stealing evens out the long tuning tests): the default
# suite, the fuzz run (10,000 examples per parser) and bench-smoke (tests/test_bench_smoke.py) together.
test: $(STAMP) $(HEADERS)
	$(BIN)/ruff check core console tests bench
	$(BIN)/lint-imports
	$(BIN)/pytest -q -n auto --dist worksteal -m "not gpu"

# Every benchmark script end to end (injection and browsing at small sizes; the figures in
# docs/BENCHMARKS.md come from full runs). About 2 minutes. `make test` runs it too, with no ../shared
# in reach (tests/test_bench_smoke.py).
bench-smoke: $(STAMP)
	$(BIN)/python bench/smoke.py

lint: $(STAMP)
	$(BIN)/ruff check core console tests bench
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
