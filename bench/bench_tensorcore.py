"""Tensor-core rows on the GPU against cuDNN/cuBLAS in the same precision (issue 38).

    python3 bench/bench_tensorcore.py sample OPS.txt KERNELS.json --per-op 6    # on the CPU: default + sampled tilings
    python3 bench/bench_tensorcore.py rows KERNELS.json --out DIR               # on a GPU: inject, verify, time, table
    python3 bench/bench_tensorcore.py tune OPS.txt --trials 128 --out DIR       # on a GPU: tuned (kdb tune's engine)
    python3 bench/bench_tensorcore.py table DIR/tune.db --out DIR                # on a GPU: the table of a cut-off run

`sample` writes each op's default kernel (what `kdb codegen` generates) and kernels of random tilings of its
tensor-core design space (what tuning tries), so one GPU run checks many schedules. `rows` and `tune` inject through
the product's own path (nvcc check, verification against float64 under the op's bound, timing as rows are timed) and
print one table: each op's default row, its fastest row, the library in the op's precision (fp16: PyTorch's half
calls; float: TF32 off), and the geometric mean of fastest/library. JSON goes to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def sample(ops: Path, out: Path, per_op: int, arch: str, math: str = "fp32") -> None:
    """Default kernels and `per_op` random tilings of each op's design space, as one kernel JSON file (math "tf32":
    fp32 ops in TF32)."""
    import tvm.s_tir as s_tir
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, generate, on_tensor_cores, prim_func_module
    from core.opconfigs.opconfig import read_opconfigs, with_math
    from core.tuning.space import tensor_core_space

    items = []
    for config in (with_math(c, math) for c in read_opconfigs(ops).configs):
        default = generate(config, arch)
        if default.item is None:
            print(f"{config.describe()}: default failed: {default.error}")
            continue
        default.item["tvm_func_name"] = default.item["tvm_func_name"].replace("_kernel0", "_default_kernel0")
        items.append(default.item)
        print(f"{config.describe()}: {default.notes[-1]}")
        if not on_tensor_cores(config):
            continue
        mod, _ = prim_func_module(config)
        space = tensor_core_space(config)
        context = ms.TuneContext(mod=mod, target=cuda_target(arch), space_generator=space, task_name="sample")
        designs = context.space_generator.generate_design_space(mod)
        taken, seed = 0, 0
        while taken < per_op and seed < 50 * per_op:
            seed += 1
            sch = s_tir.Schedule(mod, seed=seed)
            space = (taken + seed) % len(designs)  # each of the op's design spaces in turn
            designs[space].trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=lambda *_: None)
            if not all(p.apply(sch) for p in context.space_generator.postprocs):
                continue
            generated = generate(config, arch, scheduled=sch.mod, check=False)
            if generated.item is None:
                print(f"  seed {seed}: {generated.error[:200]}")
                continue
            tag = f"_{space_name(designs[space])}{seed}_kernel0"
            generated.item["tvm_func_name"] = generated.item["tvm_func_name"].replace("_kernel0", tag)
            items.append(generated.item)
            taken += 1
        print(f"  {taken} sampled tilings")
    out.write_text(json.dumps(items), encoding="utf-8")
    print(f"{len(items)} kernels -> {out}")


def space_name(design) -> str:  # type: ignore[no-untyped-def]
    """'p2' or 'p3' pipelined (its shared buffers) or 'n' not, then 's' sliced or 'w' whole k: which design space a
    sample came from."""
    trace = str(design.trace)
    stages = re.search(r'"software_pipeline_stage", ann_val=\[0, 0, (\d+)\]', trace)
    return (f"p{int(stages.group(1)) + 1}" if stages else "n") + ("s" if "rfactor" in trace.lower() else "w")


def table(db_path: Path, out: Path, label: str) -> None:
    from bench_gpu import ceilings, geomean, rows_report

    if not db_path.exists():  # (every op failed before injecting a row: the log above says why)
        print(f"no rows: {db_path} was never written")
        return
    ceil = ceilings()
    rows = rows_report(db_path, ceil, source=label)
    by_op: dict[str, list[dict]] = {}
    for r in rows:
        by_op.setdefault(r["op"], []).append(r)
    spaces = ("pw", "ps", "nw", "ns")  # the design spaces' samples
    print(f"{'op':60} {'math':6} {'default':>8} " + " ".join(f"{x:>7}" for x in spaces)
          + f" {'fastest':>8} {'library':>8} {'fast/lib':>8} {'max err':>8}")
    ratios, default_ratios = [], []
    for op, op_rows in sorted(by_op.items()):
        timed = [r for r in op_rows if r["ours_us"]]
        fastest = min(timed, key=lambda r: r["ours_us"]) if timed else None
        default = next((r for r in timed if "_default_" in r["name"]), None)
        best = {x: min((r["ours_us"] for r in timed if re.search(rf"_{x}\d+_", r["name"])), default=math.nan)
                for x in spaces}
        lib = op_rows[0]["library_us"]
        ratio = fastest["ours_us"] / lib if fastest else None
        if ratio:
            ratios.append(ratio)
        if default:
            default_ratios.append(default["ours_us"] / lib)
        errors = [r["max_rel_error"] for r in op_rows if r["max_rel_error"] is not None]
        math_kind = "tensor" if any(r["tensor_cores"] for r in op_rows) else "cuda"
        print(f"{op[:60]:60} {math_kind:6} {default['ours_us'] if default else math.nan:8.2f} "
              + " ".join(f"{best[x]:7.2f}" for x in spaces)
              + f" {fastest['ours_us'] if fastest else math.nan:8.2f} {lib:8.2f} {ratio or math.nan:8.2f} "
              f"{max(errors) if errors else math.nan:8.1e}")
    print(f"ratio: fastest row / library (same precision) geomean {geomean(ratios):.3f}x over {len(ratios)} ops; "
          f"default rows {geomean(default_ratios):.3f}x over {len(default_ratios)}")
    (out / f"{label}.json").write_text(json.dumps({"ceilings": ceil, "rows": rows}, indent=1))


def inject(kernels: Path, db_path: Path) -> None:
    from core.db.kernel_db import KernelDB
    from core.db.state import StateDB
    from core.inject.pipeline import InjectOptions, Injector

    start = time.perf_counter()
    with KernelDB.open(db_path, create=True) as db:
        report = Injector(db, InjectOptions(archs=("sm_90",), compile=True, workers=os.cpu_count() or 1,
                                            verify=True, profile=True, gpu_timeout_s=120),
                          state=StateDB()).run([kernels])
    print(f"inject --verify --profile: {report.injected} injected, {report.unchanged} unchanged, {report.failed} "
          f"failed in {time.perf_counter() - start:.0f} s; {'; '.join(report.notes)}")
    for f in report.failures:
        print(f"  FAILED #{f.index} {f.name}: {f.stage}: {f.reason[:300]}")


def tune(ops: Path, out: Path, trials: int, db_path: Path, workers: int) -> None:
    from core.inject.pipeline import InjectOptions
    from core.opconfigs.opconfig import read_opconfigs
    from core.tuning.job import TuneJob
    from core.tuning.queue import run_queue

    jobs = [TuneJob(c, trials=trials, arch="sm_90", trials_per_batch=64, builder_workers=workers)
            for c in read_opconfigs(ops).configs]
    start = time.perf_counter()
    report = run_queue(jobs, db_path=db_path,
                       inject_options=InjectOptions(archs=("sm_90",), compile=True, workers=os.cpu_count() or 1,
                                                    verify=True, profile=True, gpu_timeout_s=120),
                       on_job=lambda e: print(f"  {e.status}: {e.job}: {e.detail}", flush=True))
    for r in report.results:
        print(f"  {r.job.name}: {r.new_trials} trials in {r.seconds:.0f} s = {r.trials_per_minute:.0f}/min; "
              f"errors {r.errors}; best record {(r.best_seconds or 0) * 1e6:.2f} us")
    print(f"tuned {len(jobs)} ops in {time.perf_counter() - start:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["sample", "rows", "tune", "table"])
    ap.add_argument("input", type=Path)
    ap.add_argument("kernels", type=Path, nargs="?", help="sample: the kernel JSON to write")
    ap.add_argument("--per-op", type=int, default=6)
    ap.add_argument("--trials", type=int, default=128)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--math", choices=["fp32", "tf32"], default="fp32", help="sample: fp32 ops in TF32")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tune: build workers")
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="kdb-tc-")))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("KDB_STATE_DIR", str(args.out / "state"))
    if args.part == "sample":
        sample(args.input, args.kernels or args.out / "kernels.json", args.per_op, args.arch, args.math)
        return
    if args.part == "table":  # the rows a run cut off at its time limit left in its DB
        table(args.input, args.out, "tune")
        return
    db_path = args.out / f"{args.part}.db"
    if args.part == "rows":
        inject(args.input, db_path)
    else:
        tune(args.input, args.out, args.trials, db_path, args.workers)
    table(db_path, args.out, args.part)


if __name__ == "__main__":
    main()
