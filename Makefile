# Two entry points: `make run` (the console on a demo kernel DB) and `make test`.
# Everything installs into .venv from this project's own pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_EXTRA := $(VENV)/.run-extra

.PHONY: run test bench-smoke fuzz lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[tvm,dev]'
	touch $(STAMP)

# The `run` extra (cuDNN, cuBLAS, ONNX Runtime: about 1 GB of wheels) for the tests only: the network zoo compiles
# NNFusion's generated code with the real library headers (tests/test_zoo.py), and `kdb nnfusion --run` builds and
# links it (tests/test_nnfusion_run.py). `make run` does without.
$(RUN_EXTRA): $(STAMP)
	$(BIN)/pip install -q -e '.[run]'
	touch $(RUN_EXTRA)

run: $(STAMP)
	$(BIN)/kdb console --demo

# One pytest run over every core (pytest-xdist; work stealing evens out the long tuning tests): the default
# suite, the fuzz run (10,000 examples per parser) and bench-smoke (tests/test_bench_smoke.py) together.
test: $(STAMP) $(RUN_EXTRA)
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
