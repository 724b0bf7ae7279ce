"""Injection benchmarks: throughput without nvcc, memory flat in N, nvcc parallel efficiency, CLI cold start.

    .venv/bin/python bench/bench_inject.py                 # everything, prints tables, writes bench/results/
    .venv/bin/python bench/bench_inject.py --sizes 1000 10000 --workers 2
    .venv/bin/python bench/bench_inject.py --sizes 100 300 --nvcc-kernels 4 --json /tmp/inject.json  # CI's smoke run

The corpus is the artifact's kernels (../shared/nnfusion-artifact/kernels) where they are present, else the
demo kernels the project writes itself (core/demo.py), repeated to N; every copy gets a distinct body (a
comment naming the copy) and name, so nothing is deduplicated: each kernel goes through validate, parse,
barrier count, row building and its own insert transaction. The figures in docs/BENCHMARKS-HISTORY.md are
the artifact's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from shared_data import distinct_copies, kernel_corpus, write_corpus  # noqa: E402


def child(n: int, workers: int, compile_check: bool, archs: tuple[str, ...]) -> dict:
    """One measured run in a fresh process (so peak RSS is this run's own)."""
    from core.inject.pipeline import InjectOptions
    from core.inject.session import open_injector

    with tempfile.TemporaryDirectory(prefix="kdb-bench-") as tmp:
        tmp_path = Path(tmp)
        os.environ["KDB_STATE_DIR"] = str(tmp_path / "state")
        corpus = tmp_path / "corpus"
        source, base = kernel_corpus()
        write_corpus(n, corpus)
        options = InjectOptions(archs=archs, compile=compile_check, workers=workers)
        with open_injector(tmp_path / "k.db", options) as injector:
            start = time.perf_counter()
            report = injector.run([corpus])
            elapsed = time.perf_counter() - start
            rows = injector.db.count()
        db_mb = (tmp_path / "k.db").stat().st_size / 1e6
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"n": n, "workers": workers, "compile": compile_check, "corpus": f"{len(base)} kernels of {source}",
            "seconds": elapsed, "per_s": n / elapsed,
            "injected": report.injected, "failed": report.failed, "rows": rows,
            "peak_rss_mb": self_kb / 1024, "worker_peak_rss_mb": child_kb / 1024, "db_mb": db_mb}


def sqlite_ceiling(n: int) -> dict:
    """The same N rows inserted by bare sqlite3 (same DDL and pragmas, one transaction per row), with no
    parsing, counting, ORM or worker processes: what SQLite alone manages for these row sizes here."""
    import sqlite3

    from core.db.kernel_db import COLUMNS, KernelDB
    from core.inject.prepare import prepare

    rows = []
    for i, item in enumerate(distinct_copies(n)):  # built untimed, as write_corpus + prepare would give them
        row = prepare("corpus.json", i, item).row
        assert row is not None
        rows.append(row.values())
    with tempfile.TemporaryDirectory(prefix="kdb-bench-") as tmp:
        path = Path(tmp) / "k.db"
        KernelDB.open(path, create=True).close()
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        insert = f"INSERT INTO KernelCache ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        start = time.perf_counter()
        for values in rows:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(insert, values)
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        conn.close()
    return {"n": n, "seconds": elapsed, "per_s": n / elapsed,
            "row_kb": sum(len(str(v)) for r in rows for v in r) / len(rows) / 1000}


def child_result(*args: str) -> dict:
    """Run this script again as a measured child; its result is its last stdout line. When the child fails,
    exit with the child's own error (its stderr), not the bare exit status."""
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"bench_inject.py {' '.join(args)}: the child exited {proc.returncode}:\n"
                 f"{proc.stderr.strip() or proc.stdout.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(n: int, workers: int, compile_check: bool = False, archs: tuple[str, ...] = ("sm_90",)) -> dict:
    return child_result("--child", str(n), "--workers", str(workers), "--archs", *archs,
                        *(["--compile"] if compile_check else []))


def cold_start(repeats: int = 15) -> dict:
    kdb = [sys.executable, "-m", "console.entry", "--help"]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(kdb, capture_output=True, check=True, cwd=REPO)
        times.append(time.perf_counter() - start)
    bare = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], capture_output=True, check=True)
        bare.append(time.perf_counter() - start)
    return {"median_ms": statistics.median(times) * 1000, "python_alone_ms": statistics.median(bare) * 1000}


def table(title: str, rows: list[dict], cols: list[tuple[str, str, str]]) -> None:
    print(f"\n{title}")
    print("  ".join(f"{label:>{len(label) + 2}}" for _, label, _ in cols))
    for r in rows:
        print("  ".join(f"{format(r[key], fmt):>{len(label) + 2}}" for key, label, fmt in cols))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", type=int)
    ap.add_argument("--ceiling-child", type=int)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--archs", nargs="+", default=["sm_90"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 2500, 5000, 10000])
    ap.add_argument("--nvcc-kernels", type=int, default=24)
    ap.add_argument("--json", type=Path, default=RESULTS / "inject.json", help="results file")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.workers, args.compile, tuple(args.archs))))
        return
    if args.ceiling_child:
        print(json.dumps(sqlite_ceiling(args.ceiling_child)))
        return
    args.json.parent.mkdir(parents=True, exist_ok=True)
    results: dict = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}

    runs = [run_child(n, args.workers) for n in args.sizes]
    results["throughput"] = runs
    results["corpus"] = runs[0]["corpus"]
    print(f"corpus: {runs[0]['corpus']}, repeated to N")
    table(f"injection without nvcc ({args.workers} workers, distinct kernels, one transaction each)", runs,
          [("n", "kernels", "d"), ("seconds", "seconds", ".2f"), ("per_s", "kernels/s", ".0f"),
           ("peak_rss_mb", "main RSS MB", ".0f"), ("worker_peak_rss_mb", "worker RSS MB", ".0f"),
           ("db_mb", "DB MB", ".0f")])
    first, last = runs[0], runs[-1]
    ceiling = results["sqlite_ceiling"] = child_result("--ceiling-child", str(last["n"]))
    print(f"  ratio: {last['per_s']:.0f} kernels/s at N={last['n']} (target >= 2000); main RSS "
          f"{last['peak_rss_mb'] / first['peak_rss_mb']:.2f}x from N={first['n']} to N={last['n']} (flat: ~1.0x)")
    print(f"  ceiling: bare sqlite3 inserts of the same {ceiling['n']} rows ({ceiling['row_kb']:.0f} KB each, one "
          f"transaction each, nothing else): {ceiling['per_s']:.0f} rows/s; the injector reaches "
          f"{last['per_s'] / ceiling['per_s']:.0%} of it")

    nv = [run_child(args.nvcc_kernels, w, compile_check=True, archs=tuple(args.archs)) for w in (1, args.workers)]
    results["nvcc"] = nv
    speedup = nv[0]["seconds"] / nv[1]["seconds"]
    efficiency = speedup / args.workers
    results["nvcc_efficiency"] = efficiency
    table(f"injection with nvcc compile checks ({args.nvcc_kernels} kernels, {', '.join(args.archs)})", nv,
          [("workers", "workers", "d"), ("seconds", "seconds", ".2f"), ("per_s", "kernels/s", ".2f")])
    print(f"  ratio: speed-up {speedup:.2f}x on {args.workers} workers = {efficiency:.0%} parallel efficiency "
          "(target >= 80%)")

    cs = cold_start()
    results["cold_start"] = cs
    print(f"\n`kdb --help` cold start: {cs['median_ms']:.0f} ms median (python alone {cs['python_alone_ms']:.0f} ms;"
          f" target < 300 ms)")
    args.json.write_text(json.dumps(results, indent=1))
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
