"""What `kdb nnfusion` adds to the compiler's own run time, on a ResNet of 109 nodes (tests/onnx_models.py).

    python3 bench/bench_nnfusion.py [--nnfusion BIN] [--reps 5] [--json FILE]

Builds a DB for the model once (TVM's default schedule for every op config, injected without nvcc), then times,
alternating, the compiler alone (`nnfusion model.onnx -f onnx -fkernel_cache_path=DB`, as a user runs it) and
`kdb nnfusion` on the same model and DB (extraction, coverage, the compiler at -min_log_level=0, reading
nnfusion_rt.cu). Prints a table and the ratio; the target is at most 1.2x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from shared_data import shared_path  # noqa: E402

SHARED_COMPILER = shared_path("nnfusion/bin/nnfusion")


def build(work: Path) -> tuple[Path, Path]:
    from onnx_models import resnet, write

    model = write(resnet(), work / "resnet.onnx")
    db = work / "k.db"
    default_schedule_db(model, db, work / "kernels.json")
    return model, db


def default_schedule_db(model: Path, db: Path, kernels: Path) -> str:
    """A DB of TVM's default schedule for every op config of `model` (kernel JSON kept at `kernels`), injected
    without nvcc; what it holds, in words."""
    from core.codegen.batch import generate_all
    from core.db.kernel_db import KernelDB
    from core.inject.pipeline import InjectOptions, Injector
    from core.opconfigs.onnx_extract import extract

    report = generate_all(extract(model).configs, "sm_90", check=False)
    kernels.write_text(json.dumps(report.items), encoding="utf-8")
    db.unlink(missing_ok=True)
    with KernelDB.open(db, create=True) as kdb:
        injected = Injector(kdb, InjectOptions(compile=False), state=None).run([kernels], kind="bench")
    return (f"{injected.injected} default-schedule rows, {injected.failed} failed, {len(report.failed)} op(s) TVM "
            "could not generate")


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nnfusion", type=Path, default=SHARED_COMPILER)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not args.nnfusion.is_file():
        raise SystemExit(f"no NNFusion compiler at {args.nnfusion} (--nnfusion BIN)")
    work = Path(tempfile.mkdtemp(prefix="kdb-bench-nnfusion-"))
    model, db = build(work)
    from core.opconfigs.onnx_extract import extract

    nodes = extract(model).node_count
    env = dict(os.environ, KDB_STATE_DIR=str(work / "state"))
    alone_cmd = [str(args.nnfusion), str(model), "-f", "onnx", f"-fkernel_cache_path={db}"]
    kdb_cmd = [sys.executable, "-m", "console.entry", "nnfusion", str(model), "--db", str(db), "--nnfusion",
               str(args.nnfusion), "--out", str(work / "kdb"), "--json"]
    alone, with_kdb, warm, unchecked = [], [], [], []
    kdb_env = dict(env, PYTHONPATH=str(REPO))
    for _ in range(args.reps):
        alone.append(timed(alone_cmd, work / "alone", env))
        shutil.rmtree(work / "state" / "launch-check", ignore_errors=True)  # a first compile of this model
        with_kdb.append(timed(kdb_cmd, work / "kdb", kdb_env))
        warm.append(timed(kdb_cmd, work / "kdb", kdb_env))  # again: the launch check's registers are cached
        unchecked.append(timed([*kdb_cmd, "--no-launch-check"], work / "kdb", kdb_env))
    a, k, w, u = (statistics.median(x) for x in (alone, with_kdb, warm, unchecked))
    print(f"{'run':34s} {'median s':>9s} {'min s':>7s} {'max s':>7s}")
    for label, runs in (("nnfusion alone", alone), ("kdb nnfusion (everything)", with_kdb),
                        ("  again (launch check cached)", warm), ("  --no-launch-check", unchecked)):
        print(f"{label:34s} {statistics.median(runs):9.2f} {min(runs):7.2f} {max(runs):7.2f}")
    print(f"ratio: kdb nnfusion / nnfusion alone = {k / a:.2f}x on a {nodes}-node model (target <= 1.2x), "
          f"median of {args.reps}; run again (the launch check's nvcc compile cached) {w / a:.2f}x; "
          f"without the launch check {u / a:.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"nodes": nodes, "alone_s": alone, "kdb_s": with_kdb, "kdb_again_s": warm,
                                         "kdb_no_launch_check_s": unchecked, "ratio": k / a}))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
