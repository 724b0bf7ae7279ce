"""`kdb db fastest` on a big DB: time and peak memory of the plan, against reading every row whole.

    python3 bench/bench_fastest.py --rows 100000 300000

Each DB: N CUDA_GPU rows with 2 KB kernel bodies; one op in ten holds three rows (as after three tuning runs),
each timed on the GPU. "whole rows" is the obvious way (every row of the table read as a KernelRow, grouped in
Python), the way the first version did it; "plan_fastest" lets SQLite count each op's rows and reads Key,
OpType and Miscs of the ops with more than one. Each measurement runs in a fresh process (peak RSS is per
process). Prints a table and the ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEVICE = "NVIDIA H200"
BODY = "  acc = fmaf(input0[i], input1[i], acc);\n" * 50  # about 2 KB


def write_db(path: Path, rows: int) -> None:
    from core.db.kernel_db import KernelDB

    KernelDB.open(path, create=True).close()
    conn = sqlite3.connect(path)
    fn = json.dumps({"function_signature": "x", "function_body": BODY, "grid_dim": [1, 1, 1],
                     "block_dim": [64, 1, 1], "block_function_body": BODY,
                     "shared_memory": {"symbol": [], "dtype": [], "size": []}, "num_syncthreads": 0})

    def row(i: int) -> tuple[str, ...]:
        op = i // 3 if i < rows // 10 * 3 else i  # the first tenth of the ops: three rows each
        miscs = json.dumps({"external_profile": {"time": f"{DEVICE}:{10 + i % 7}.5;", "resource": 64}})
        return (f"kdb:{i:064x}", f"Relu{op};{op}floatfloat", "Relu", "{}", "External", "CUDA_GPU", fn,
                "KernelEmitter,CudaEmitter,BlockCudaEmitter", miscs)

    conn.executemany("INSERT INTO KernelCache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (row(i) for i in range(rows)))
    conn.commit()
    conn.close()


def whole_rows(path: Path) -> int:
    """Every row read whole and grouped in Python (the baseline)."""
    from core.db.fastest import time_on
    from core.db.kernel_db import KernelDB
    from core.errors import InputError

    ops: dict[tuple[str, str], list] = {}
    with KernelDB.open(path) as db:
        for row in db.iter_table_order():
            ops.setdefault((row.identifier, row.tags), []).append(row)
    removals = 0
    for rows in ops.values():
        if len(rows) > 1:
            timed = []
            for r in rows:
                try:
                    timed.append(time_on(r.miscs, DEVICE))
                except InputError:
                    continue
            removals += len(rows) - 1 if timed else 0
    return removals


def planned(path: Path) -> int:
    from core.db.fastest import plan_fastest
    from core.db.kernel_db import KernelDB

    with KernelDB.open(path) as db:
        return len(plan_fastest(db, DEVICE).removals)


def child(way: str, path: Path) -> None:
    start = time.perf_counter()
    removals = {"whole rows": whole_rows, "plan_fastest": planned}[way](path)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mb": peak_mb, "removals": removals}))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000])
    args = ap.parse_args()
    print(f"{'rows':>9} {'DB MB':>7} {'way':<13} {'seconds':>8} {'peak MB':>8} {'removals':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.rows:
            path = Path(tmp) / f"k{n}.db"
            write_db(path, n)
            runs = {}
            for way in ("whole rows", "plan_fastest"):
                out = subprocess.run([sys.executable, __file__, "--child", way, str(path)], capture_output=True,
                                     text=True, check=True).stdout
                runs[way] = json.loads(out.strip().splitlines()[-1])
                r = runs[way]
                print(f"{n:>9} {path.stat().st_size / 1e6:7.0f} {way:<13} {r['seconds']:8.2f} {r['peak_mb']:8.0f} "
                      f"{r['removals']:>9}")
            a, b = runs["whole rows"], runs["plan_fastest"]
            assert a["removals"] == b["removals"], "the two ways disagree"
            print(f"ratio at {n} rows: plan_fastest takes {b['seconds'] / a['seconds']:.2f}x the time and "
                  f"{b['peak_mb'] / a['peak_mb']:.2f}x the peak memory of reading whole rows")


if __name__ == "__main__":
    main()
