"""The H200 run: every artifact kernel verified and timed through the console's own path, next to
cuDNN/cuBLAS through PyTorch (fp32, TF32 off, timed inside CUDA graph replays); then kernels tuned with
MetaSchedule for a subset of the same op configs, with the tuning throughput.

    python3 bench/bench_gpu.py artifact --out DIR            # part a
    python3 bench/bench_gpu.py tune --out DIR --ops 4 --trials 64   # part b

Both print a table and a ratio line and write JSON into DIR. Each kernel's distance to its roofline
floor uses ceilings measured here, once: an fp32 GEMM (TF32 off) and a device-to-device copy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from shared_data import shared_dir  # noqa: E402

SHARED = shared_dir()


def torch_setup(tf32: bool = False):  # type: ignore[no-untyped-def]
    import torch

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    return torch


def ceilings() -> dict:
    torch = torch_setup()
    n = 8192
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    stop.record()
    stop.synchronize()
    flops = 2 * n**3 * 10 / (start.elapsed_time(stop) / 1000)
    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    start.record()
    for _ in range(10):
        y.copy_(x)
    stop.record()
    stop.synchronize()
    bw = 2 * x.numel() * 4 * 10 / (start.elapsed_time(stop) / 1000)
    del a, b, x, y
    torch.cuda.empty_cache()
    return {"fp32_flops": flops, "hbm_bytes_per_s": bw}


class NoLibraryTwin(ValueError):
    """The op has no cuDNN/cuBLAS call to time against (an element-wise Add, say)."""


def library_us(op_type: str, p: dict, repeats: int = 200, *, dtype: str = "float", tf32: bool = False) -> float:
    """cuDNN/cuBLAS through PyTorch inside CUDA graph replays, median GPU time of one replay (convolutions,
    pools, Dot), in the op's element type (half: PyTorch's fp16 calls; tf32: fp32 with TF32 allowed, as PyTorch's
    convolutions ship); NoLibraryTwin for any other op."""
    torch = torch_setup(tf32)
    import torch.nn.functional as F

    kind = {"float": torch.float32, "half": torch.float16}[dtype]

    l2 = torch.cuda.get_device_properties(0).L2_cache_size

    def make():  # type: ignore[no-untyped-def]
        if "filter_shape" in p:
            x = torch.rand(p["input_shape"], device="cuda", dtype=kind) * 2 - 1
            w = torch.rand(p["filter_shape"], device="cuda", dtype=kind) * 2 - 1
            pb, pa = p["padding_below_diff"], p.get("padding_above_diff", p["padding_below_diff"])
            bias = (torch.rand(p["output_shape"], device="cuda", dtype=kind)
                    if op_type == "Fused_Convolution_Add_Relu" else None)

            def fn():  # type: ignore[no-untyped-def]
                xin = x if pb == pa else F.pad(x, (pb[1], pa[1], pb[0], pa[0]))
                y = F.conv2d(xin, w, stride=p["window_movement_strides"], padding=tuple(pb) if pb == pa else 0,
                             dilation=p["window_dilation_strides"])
                if bias is not None:
                    y = y + bias
                return torch.relu(y) if op_type != "Convolution" else y
            tensors = [x, w] + ([bias] if bias is not None else [])
        elif "window_shape" in p:  # MaxPool / AvgPool (cuDNN's pooling through PyTorch)
            x = torch.rand(p["input_shape"], device="cuda", dtype=kind)
            pb, pa = p["padding_below"], p["padding_above"]
            pool = F.max_pool2d if op_type == "MaxPool" else F.avg_pool2d

            def fn():  # type: ignore[no-untyped-def]
                xin = x if pb == pa else F.pad(x, (pb[1], pa[1], pb[0], pa[0]))
                return pool(xin, p["window_shape"], p["window_stride"], tuple(pb) if pb == pa else 0)
            tensors = [x]
        elif op_type in ("Dot", "BatchMatMul"):  # (a BatchMatMul: torch.matmul's batched cuBLAS call)
            a = torch.rand(p["arg0_shape"], device="cuda", dtype=kind)
            b = torch.rand(p["arg1_shape"], device="cuda", dtype=kind)

            def fn():  # type: ignore[no-untyped-def]
                return (a.t() if p.get("transpose_A") else a) @ (b.t() if p.get("transpose_B") else b)
            tensors = [a, b]
        else:
            raise NoLibraryTwin(f"{op_type}: no cuDNN/cuBLAS call to time it against")
        return fn, sum(t.numel() * t.element_size() for t in tensors)

    fn, _ = make()
    # Timed as core.gpu.worker times our kernels: each replay after a memset over twice the L2 (cold
    # inputs; the GPU stays busy while Python queues the next replay), per-replay events, the median.
    flush = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, stop in pairs:
        flush.zero_()
        start.record()
        graph.replay()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) * 1000 for start, stop in pairs)


def op_bytes(op_type: str, p: dict) -> int:
    if "filter_shape" in p:
        shapes = [p["input_shape"], p["filter_shape"], p["output_shape"]] + (
            [p["output_shape"]] if op_type == "Fused_Convolution_Add_Relu" else [])
    else:
        shapes = [p["arg0_shape"], p["arg1_shape"], p["out_shape"]]
    return sum(math.prod(s) * 4 for s in shapes)


def rows_report(db_path: Path, ceil: dict, *, source: str) -> list[dict]:
    from core.db.kernel_db import KernelDB
    from core.kernels.export import row_to_item
    from core.opconfigs.opconfig import OpConfig

    rows = []
    with KernelDB.open(db_path) as db:
        for row in db.iter_rows():
            miscs = json.loads(row.miscs)
            kdb = miscs.get("kdb", {})
            prof = next(iter(kdb.get("profile", {}).values()), {})
            item = row_to_item(row)
            dtype = item.get("dtype", "float")
            config = OpConfig(row.op, item["parameters"], dtype=dtype)  # (row.op: a BatchMatMul row's OpType says Dot)
            flops = config.flops
            nbytes = op_bytes(row.op, item["parameters"])
            floor_us = max(flops / ceil["fp32_flops"], nbytes / ceil["hbm_bytes_per_s"]) * 1e6
            ours = prof.get("us")
            tf32 = item.get("math") == "tf32"  # a TF32 row against the library in TF32 (PyTorch's default for convs)
            lib = library_us(row.op, item["parameters"], dtype=dtype, tf32=tf32)
            rows.append({"source": source, "name": kdb.get("name", row.key[:16]), "op_type": row.op,
                         "dtype": "tf32" if tf32 else dtype,
                         "tensor_cores": "mma.sync" in json.loads(row.function)["function_body"],
                         "op": config.describe(), "ours_us": ours, "library_us": lib,
                         "ratio": ours / lib if ours else None, "floor_us": floor_us,
                         "roofline_distance": ours / floor_us if ours else None,
                         "max_rel_error": kdb.get("verified", {}).get("max_rel_error"),
                         "barriers": json.loads(row.function)["num_syncthreads"]})
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'kernel':58} {'ours us':>9} {'lib us':>9} {'ours/lib':>8} {'floor us':>9} {'x floor':>8} {'rel err':>8}")
    for r in sorted(rows, key=lambda r: (r["op_type"], r["op"])):
        ours = f"{r['ours_us']:.2f}" if r["ours_us"] else "n/m"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        dist = f"{r['roofline_distance']:.1f}" if r["roofline_distance"] else "-"
        err = f"{r['max_rel_error']:.0e}" if r["max_rel_error"] is not None else "-"
        print(f"{r['name'][:58]:58} {ours:>9} {r['library_us']:9.2f} {ratio:>8} {r['floor_us']:9.2f} {dist:>8} "
              f"{err:>8}")


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def part_artifact(out: Path, only: str = "*.json") -> None:
    from core.db.kernel_db import KernelDB
    from core.db.state import StateDB
    from core.inject.pipeline import InjectOptions, Injector

    ceil = ceilings()
    print(f"ceilings measured here: fp32 GEMM {ceil['fp32_flops'] / 1e12:.1f} TFLOP/s (TF32 off), "
          f"copy {ceil['hbm_bytes_per_s'] / 1e12:.2f} TB/s")
    tmp = Path(tempfile.mkdtemp(prefix="kdb-gpu-"))
    os.environ["KDB_STATE_DIR"] = str(tmp / "state")
    start = time.perf_counter()
    with KernelDB.open(tmp / "artifact.db", create=True) as db:
        report = Injector(db, InjectOptions(archs=("sm_90",), compile=True, workers=os.cpu_count() or 1,
                                            verify=True, profile=True, gpu_timeout_s=120),
                          state=StateDB()).run(sorted((SHARED / "nnfusion-artifact" / "kernels").glob(only)))
    inject_s = time.perf_counter() - start
    print(f"inject --verify --profile: {report.injected} injected, {report.unchanged} unchanged (duplicates), "
          f"{report.failed} failed in {inject_s:.0f} s; {'; '.join(report.notes)}")
    for f in report.failures:
        print(f"  FAILED {f.file.split('/')[-1]}#{f.index} {f.name}: {f.stage}: {f.reason}")
    rows = rows_report(tmp / "artifact.db", ceil, source="artifact (V100-tuned, 2020)")
    print_rows(rows)
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    print(f"ratio: artifact kernels vs cuDNN/cuBLAS geometric mean {geomean(ratios):.2f}x "
          f"({sum(r < 1 for r in ratios)} of {len(ratios)} faster than the library); "
          f"{len([r for r in rows if r['max_rel_error'] is not None])} verified")
    name = "artifact.json" if only == "*.json" else f"artifact-{only.replace('*', '').replace('.json', '')}.json"
    (out / name).write_text(json.dumps({"ceilings": ceil, "inject_seconds": inject_s,
                                                   "failures": [f.as_report() for f in report.failures],
                                                   "notes": report.notes, "rows": rows}, indent=1))


TUNE_SET = [  # (file, line index, op type): AlexNet conv+relu layers and ResNeXt conv layers
    ("alexnet_conv_kernels.txt", 1, "Fused_Convolution_Relu"),
    ("alexnet_conv_kernels.txt", 2, "Fused_Convolution_Relu"),
    ("alexnet_conv_kernels.txt", 3, "Fused_Convolution_Relu"),
    ("alexnet_conv_kernels.txt", 4, "Fused_Convolution_Relu"),
    ("resnext_conv_kernels.txt", 0, "Convolution"),
    ("resnext_conv_kernels.txt", 6, "Convolution"),
]


def part_tune(out: Path, n_ops: int, trials: int, pick: list[int] | None = None) -> None:
    from dataclasses import replace

    from tvm.s_tir import meta_schedule as ms

    from core.inject.pipeline import InjectOptions
    from core.opconfigs.opconfig import read_opconfigs
    from core.tuning.job import TuneJob
    from core.tuning.queue import run_queue

    ceil = ceilings()
    tmp = Path(tempfile.mkdtemp(prefix="kdb-tune-"))
    os.environ["KDB_STATE_DIR"] = str(tmp / "state")
    jobs = []
    chosen = [TUNE_SET[i - 1] for i in pick] if pick else TUNE_SET[:n_ops]
    for file, index, op in chosen:
        config = read_opconfigs(SHARED / "nnfusion-artifact" / "op_configs" / file).configs[index]
        jobs.append(TuneJob(replace(config, op_type=op, line_format=None), trials=trials, arch="sm_90",
                            builder_timeout_s=120, trials_per_batch=64, builder_workers=os.cpu_count()))
    events: list[dict] = []
    finished: list[dict] = []

    def on_job(e) -> None:  # type: ignore[no-untyped-def]
        print(f"  {e.status}: {e.job}: {e.detail}", flush=True)
        if e.result is not None and e.status in ("generating", "done", "failed", "cancelled"):
            r = e.result
            finished.append({"op": r.job.name, "status": e.status, "trials": r.new_trials, "seconds": r.seconds,
                             "trials_per_minute": r.trials_per_minute, "best_us": (r.best_seconds or 0) * 1e6,
                             "errors": r.errors, "detail": e.detail})
            (out / "tune_progress.json").write_text(json.dumps({"jobs": finished, "events": events}, indent=1))

    start = time.perf_counter()
    with ms.Profiler() as profiler:  # where tuning time goes: search, builds, measurements
        report = run_queue(jobs, db_path=tmp / "tuned.db",
                           inject_options=InjectOptions(archs=("sm_90",), compile=True, workers=os.cpu_count() or 1,
                                                        verify=True, profile=True, gpu_timeout_s=120),
                           on_trial=lambda e: events.append({"job": e.job, "trial": e.trial, "s": e.seconds,
                                                             "best_s": e.best_seconds, "error": e.error,
                                                             "t": e.elapsed_s}),
                           on_job=on_job)
    phases = {str(name): round(float(seconds), 1) for name, seconds in profiler.get().items()}
    print(profiler.table())
    total_s = time.perf_counter() - start
    tuned_db = tmp / "tuned.db"
    rows = rows_report(tuned_db, ceil, source="tuned here (MetaSchedule)") if tuned_db.exists() else []
    print_rows(rows)
    for r in report.results:
        chosen = ", ".join(f"{c['role']} {c['seconds'] * 1e6:.1f} us" for c in r.candidates)
        print(f"  {r.job.name}: {r.new_trials} trials in {r.seconds:.0f} s = {r.trials_per_minute:.0f}/min; "
              f"errors {r.errors}; MetaSchedule's time of the records injected: {chosen or '-'}")
    trials = sum(r.new_trials for r in report.results)
    tune_s = sum(r.seconds for r in report.results)
    best = {}
    for r in rows:
        best[r["op"]] = min(best.get(r["op"], math.inf), r["ratio"] or math.inf)
    alex_resnext = [v for v in best.values() if v != math.inf]
    print(f"ratio: tuned kernels vs cuDNN/cuBLAS geometric mean {geomean(alex_resnext):.2f}x over {len(best)} ops "
          f"(target <= 1.0); tuning {trials} trials in {tune_s:.0f} s = {trials / (tune_s / 60):.0f} trials/min "
          f"(target >= 60); whole run {total_s:.0f} s")
    (out / "tune.json").write_text(json.dumps({"ceilings": ceil, "rows": rows, "events": events,
                                               "trials_per_minute": trials / (tune_s / 60) if tune_s else None,
                                               "phases_s": phases,
                                               "failures": report.failures,
                                               "jobs": [{"op": r.job.name, "trials": r.new_trials, "seconds": r.seconds,
                                                         "errors": r.errors, "best_us": (r.best_seconds or 0) * 1e6,
                                                         "injected_records": r.candidates}
                                                        for r in report.results]}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["artifact", "tune"])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--ops", type=int, default=4)
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--pick", type=int, nargs="+", help="ops of the set to tune (1-based)")
    ap.add_argument("--only", default="*.json", help="artifact kernel files to take (a glob)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "artifact":
        part_artifact(args.out, args.only)
    else:
        part_tune(args.out, args.ops, args.trials, args.pick)


if __name__ == "__main__":
    main()
