"""bench-smoke as a fresh clone runs it: no ../shared in reach, every benchmark on the project's own data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from shared_data import ARTIFACT_KERNELS, SHARED_ENV
from test_kernel_row import NVCC

REPO = Path(__file__).resolve().parents[1]


def bench(script: str, *args: str, shared: Path, tmp: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, SHARED_ENV: str(shared), "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
def test_bench_smoke_runs_with_no_shared_dir(tmp_path: Path):
    out = tmp_path / "out"
    proc = bench("smoke.py", "--out", str(out), shared=tmp_path / "no-shared", tmp=tmp_path, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    inject = json.loads((out / "inject.json").read_text())
    assert inject["corpus"].endswith("kernels of the demo kernels (core/demo.py)")
    assert [(r["n"], r["injected"], r["failed"]) for r in inject["throughput"]] == [(100, 100, 0), (300, 300, 0)]
    assert [r["injected"] + r["failed"] for r in inject["nvcc"]] == [4, 4]
    codegen = json.loads((out / "codegen.json").read_text())["summary"]
    assert codegen["source"] == "the demo network (core/demo.py)" and codegen["all_ok"] and codegen["kernels"] == 8
    assert all((out / name).is_file() for name in ("browse.json", "extract.json", "cli.json"))


def test_a_failing_bench_child_shows_its_own_error(tmp_path: Path):
    shared = tmp_path / "shared"
    kernels = shared / ARTIFACT_KERNELS
    kernels.mkdir(parents=True)
    (kernels / "broken.json").write_text('[{"tvm_func_name": ', encoding="utf-8")
    proc = bench("bench_inject.py", "--sizes", "10", "--json", str(tmp_path / "inject.json"), shared=shared,
                 tmp=tmp_path, timeout=300)
    assert proc.returncode == 1
    assert f"{kernels / 'broken.json'}: cannot read kernel JSON" in proc.stderr
    assert "the child exited 1" in proc.stderr and "CalledProcessError" not in proc.stderr


def test_bench_fastest_agrees_with_the_whole_row_way_on_a_small_db(tmp_path: Path):
    proc = bench("bench_fastest.py", "--rows", "300", shared=tmp_path / "no-shared", tmp=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "ratio at 300 rows: plan_fastest takes" in proc.stdout and "    60" in proc.stdout  # 30 ops of 3 rows: 2 go from each


@pytest.mark.skipif(not NVCC, reason="nvcc not found: the bench counts PTX")
def test_bench_row_gap_finds_session_12s_3x_row_and_its_padding(tmp_path: Path):
    """The row that ran 3x its record (session 12): found from the state's kernel JSON and the DB row injected
    from it, 49 threads padded to 64, the padding's 18 non-aligned barriers where TVM's kernel has none, and the
    row today's generation makes of the same record (padded in the schedule): 2 aligned barriers, no non-aligned
    one; nothing timed without --gpu."""
    session = REPO / "bench" / "results" / "h200" / "session12"
    proc = bench("bench_row_gap.py", "--state", str(session / "7-state.tgz"), "--db", str(session / "7-tuned.db.gz"),
                 "--only", "abbdfd83dd", shared=tmp_path / "no-shared", tmp=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("fused_convolution_add_relu_abbdfd83dd"))
    assert "   36.5   111.2 " in line and " 0/18, 2/0 " in line and line.endswith("block 49->64"), line
    assert "row-whole-warps / row: not measured" in proc.stdout
    assert "row / record-nvcc: not measured" in proc.stdout


def test_bench_transfer_ranks_session_14s_dot_trials_with_a_model_of_other_ops(tmp_path: Path):
    """A quick run (2 work dirs of other ops teach): every teacher's line, the Dot's 256 trials and its best
    measured time; the figures in BENCHMARKS-HISTORY come from the full run over sessions 12 and 14."""
    session = REPO / "bench" / "results" / "h200" / "session14"
    proc = bench("bench_transfer.py", "--state", str(session / "3-state.tgz"), "--teach-ops", "2", "--test", "dot",
                 shared=tmp_path / "no-shared", tmp=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("3-state.tgz")]
    assert [" ".join(r[1:4]) for r in rows] == ["other families (convolution,", "the first 16", "all but the"]
    assert all(r[-1] == "60.0" and "256" in r for r in rows), rows
    assert all(-1 <= float(r[-6]) <= 1 for r in rows)
