"""Tuning throughput on several GPUs of one host (device kinds nvidia-h200-x2 / -x4): measured trials per
minute for the same op configs with 1, 2 (and 4) GPUs, each GPU behind its own rpc_server on a local
tracker, and the best latency reached at equal wall time.

    python3 bench/bench_multigpu.py --gpus 1 2 4 --trials 128 --out DIR

Target: at least 0.8 x N speed-up in trials per minute on N GPUs. Prints a table and a ratio line and
writes DIR/multigpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from shared_data import shared_dir  # noqa: E402

SHARED = shared_dir()


def run(n_gpus: int, trials: int) -> dict:
    from core.opconfigs.opconfig import read_opconfigs
    from core.tuning.job import RpcTarget, TuneJob
    from core.tuning.rpc import local_gpu_cluster
    from core.tuning.run import run_tune

    config = read_opconfigs(SHARED / "nnfusion-artifact" / "op_configs" / "alexnet_conv_kernels.txt").configs[2]
    config = replace(config, op_type="Fused_Convolution_Relu", line_format=None)
    root = Path(tempfile.mkdtemp(prefix=f"kdb-mgpu{n_gpus}-"))
    cluster = local_gpu_cluster(n_gpus, key=f"kdb-bench-{n_gpus}")
    curve: list[tuple[float, float]] = []
    try:
        job = TuneJob(config, trials=trials, arch="sm_90", trials_per_batch=64, builder_workers=os.cpu_count(),
                      rpc=RpcTarget(cluster.host, cluster.port, cluster.key), rpc_workers=n_gpus, seed=1)
        start = time.perf_counter()
        result = run_tune(job, root, on_event=lambda e: curve.append((time.perf_counter() - start,
                                                                      e.best_seconds or float("inf"))))
    finally:
        cluster.stop()
    return {"gpus": n_gpus, "trials": result.new_trials, "seconds": result.seconds,
            "trials_per_minute": result.trials_per_minute, "best_us": (result.best_seconds or 0) * 1e6,
            "requeued": result.requeued, "curve": curve}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--trials", type=int, default=128)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    rows = [run(n, args.trials) for n in args.gpus]
    base = rows[0]["trials_per_minute"]
    print(f"{'GPUs':>5} {'trials':>7} {'seconds':>8} {'trials/min':>11} {'speed-up':>9} {'best us':>9}")
    for r in rows:
        r["speedup"] = r["trials_per_minute"] / base if base else None
        print(f"{r['gpus']:5d} {r['trials']:7d} {r['seconds']:8.0f} {r['trials_per_minute']:11.1f} "
              f"{r['speedup']:9.2f} {r['best_us']:9.2f}")
    t = min(r["seconds"] for r in rows)
    for r in rows:
        r["best_us_at_equal_time"] = min((b for s, b in r["curve"] if s <= t), default=float("inf")) * 1e6
    last = rows[-1]
    print(f"ratio: {last['speedup']:.2f}x trials/min on {last['gpus']} GPUs = "
          f"{last['speedup'] / last['gpus']:.0%} of linear (target >= 80%); best at equal wall time "
          + ", ".join(f"{r['gpus']} GPU: {r['best_us_at_equal_time']:.2f} us" for r in rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "multigpu.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
