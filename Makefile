# Two entry points: `make run` (the console on a demo kernel DB) and `make test`.
# Everything installs into .venv from this project's own pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench-smoke fuzz lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[tvm,dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/kdb console --demo

test: $(STAMP)
	$(BIN)/ruff check core console tests bench
	$(BIN)/lint-imports
	$(BIN)/pytest -q
	$(BIN)/pytest -q -m fuzz tests/test_fuzz.py
	$(MAKE) bench-smoke

# Every benchmark script end to end (injection and browsing at small sizes; the figures in
# docs/BENCHMARKS.md come from full runs). About 2 minutes.
bench-smoke: $(STAMP)
	$(BIN)/python bench/bench_inject.py --sizes 100 300 --nvcc-kernels 4 --json $${TMPDIR:-/tmp}/kdb-bench/inject.json
	$(BIN)/python bench/bench_browse.py --sizes 2000 5000 --reps 1 --dir $${TMPDIR:-/tmp}/kdb-bench/browse \
		--json $${TMPDIR:-/tmp}/kdb-bench/browse.json
	$(BIN)/python bench/bench_codegen.py --json $${TMPDIR:-/tmp}/kdb-bench/codegen.json
	$(BIN)/python bench/bench_extract.py --json $${TMPDIR:-/tmp}/kdb-bench/extract.json
	$(BIN)/python bench/bench_cli.py --rows 2000 --runs 1 --dir $${TMPDIR:-/tmp}/kdb-bench/cli --console-rows 2000 \
		--console-runs 1 --console-dir $${TMPDIR:-/tmp}/kdb-bench/browse --json $${TMPDIR:-/tmp}/kdb-bench/cli.json

lint: $(STAMP)
	$(BIN)/ruff check core console tests bench
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
