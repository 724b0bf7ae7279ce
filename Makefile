# Two entry points: `make run` (the console on a demo kernel DB) and `make test`.
# Everything installs into .venv from this project's own pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_EXTRA := $(VENV)/.run-extra

.PHONY: run test bench-smoke fuzz lint clean

# A download cut off mid-wheel (CI once lost apache-tvm's 100 MB wheel at 45 MB, six resumes in a row) is tried
# again from the start, three times in all, before the install fails.
PIP_INSTALL = for attempt in 1 2 3; do $(BIN)/pip install -q --retries 10 --timeout 60 $(1) && exit 0; \
	echo "pip install $(1) failed (attempt $$attempt of 3); trying again" >&2; sleep 20; done; exit 1
CORE_EXTRAS := '.[tvm,dev]'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(call PIP_INSTALL,--upgrade pip)
	$(call PIP_INSTALL,-e $(CORE_EXTRAS))
	touch $(STAMP)

# The `run` extra (cuDNN, cuBLAS, ONNX Runtime: about 1 GB of wheels) for the tests only: the network zoo compiles
# NNFusion's generated code with the real library headers (tests/test_zoo.py), and `kdb nnfusion --run` builds and
# links it (tests/test_nnfusion_run.py). `make run` does without.
$(RUN_EXTRA): $(STAMP)
	$(call PIP_INSTALL,-e '.[run]')
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
