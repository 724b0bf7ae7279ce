"""GPU verification and profiling at the pace of tuning: `kdb inject --verify --profile` over real kernels.

    python3 bench/bench_verify.py --kernels DIR --workers 16            # on a GPU host (the H200)

Each mode injects every kernel JSON under DIR into a fresh DB with the nvcc check (sm of the device),
verification against float64 numpy and CUDA-event timing, as `kdb inject --verify --profile` does:

    before   one GPU child; it compiles each kernel again with pycuda (how it was until 2026-12-03)
    after    the nvcc check's cubin loaded in the child (no second compile); N children verify at once,
             timed launches take turns on the GPU (core/gpu/exclusive.py)

It prints a table (kernels, seconds, kernels/s, verified, failed) and the ratio after/before, checks that both
modes verified the same kernels, and writes JSON (--out). The state dir is a fresh temporary one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run_mode(kernels: Path, workers: int, *, before: bool, arch: str) -> dict:
    from core.inject.pipeline import InjectOptions
    from core.inject.session import open_injector
    from core.kernels.kernel_row import distinct_kernels

    options = InjectOptions(archs=(arch,), compile=True, workers=workers, verify=True, profile=True,
                            gpu_timeout_s=120, gpu_workers=1 if before else 0, reuse_cubin=not before)
    db_path = Path(tempfile.mkdtemp(prefix="kdb-bench-verify-")) / "kernels.db"
    start = time.perf_counter()
    with open_injector(db_path, options) as injector:
        report = injector.run(sorted(kernels.rglob("*.json")))
        seconds = time.perf_counter() - start
        verified = {}
        for row in distinct_kernels(injector.db.iter_rows()):  # a fused kernel's pair of rows is one kernel
            miscs = json.loads(row.miscs)
            if "verified" in miscs.get("kdb", {}):
                verified[row.key] = miscs["kdb"]["verified"].get("max_rel_error")
    done = report.injected + report.unchanged + report.failed
    return {"mode": "before" if before else "after", "gpu_children": 1 if before else options.gpu_children,
            "kernels": done, "injected": report.injected, "unchanged": report.unchanged, "failed": report.failed,
            "seconds": seconds, "per_s": done / seconds, "verified": len(verified),
            "max_rel_error": max((e for e in verified.values() if e is not None), default=None),
            "failures": [f.as_report() for f in report.failures][:20], "notes": report.notes,
            "verified_keys": sorted(verified)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=Path, required=True, help="a folder of kernel JSON files")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--modes", nargs="+", choices=["before", "after"], default=["after", "before"])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "verify.json")
    args = ap.parse_args()
    os.environ["KDB_STATE_DIR"] = tempfile.mkdtemp(prefix="kdb-bench-verify-state-")
    rows = [run_mode(args.kernels, args.workers, before=mode == "before", arch=args.arch) for mode in args.modes]
    print(f"{'mode':<8} {'GPU children':>12} {'kernels':>8} {'seconds':>8} {'kernels/s':>10} {'verified':>9} "
          f"{'failed':>7} {'max rel err':>12}")
    for r in rows:
        err = f"{r['max_rel_error']:.1e}" if r["max_rel_error"] is not None else "-"
        print(f"{r['mode']:<8} {r['gpu_children']:>12} {r['kernels']:>8} {r['seconds']:>8.1f} {r['per_s']:>10.2f} "
              f"{r['verified']:>9} {r['failed']:>7} {err:>12}")
        for f in r["failures"][:5]:
            print(f"    failed: {f.get('name', '?')}: {str(f.get('reason', ''))[:160]}")
    by = {r["mode"]: r for r in rows}
    if len(by) == 2:
        same = by["before"]["verified_keys"] == by["after"]["verified_keys"]
        print(f"ratio: after/before {by['after']['per_s'] / by['before']['per_s']:.1f}x kernels/s "
              f"({by['after']['per_s']:.2f} vs {by['before']['per_s']:.2f}); same kernels verified: {same}")
    else:
        r = rows[0]
        print(f"ratio: {r['per_s']:.2f} kernels/s ({r['mode']}, target 5)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
