"""Where a tuning trial's time goes: the phase table of `kdb tune`'s engine (run_queue), and the trials/min.

    python3 bench/bench_tune.py --target llvm --ops 3 --trials 16 --batch 8          # this CPU (any machine)
    python3 bench/bench_tune.py --target cuda --ops 5 --trials 64 --batch 64         # on a GPU host
    python3 bench/bench_tune.py --target cuda --resnet 18 --trials 64 --batch 64     # ResNet-18 as one network
    python3 bench/bench_tune.py --target llvm --model model.onnx --trials 8          # any model (budget spread)

The ops are the looked-up ops of the demo network (core/demo.py: convolutions, pools, a Dot), or a model's.
Each run starts from an empty state dir (no trial is resumed). The table splits the tuning wall time into
set-up (TVM's task set-up, pools starting), search (MetaSchedule's evolutionary search), build (waiting for
builds with nothing to measure), measure, record (trials written to the work dir), cost model (XGBoost
update), generate and inject (cuda: kernels from the best records, checked, verified, timed, injected), and
other; "build workers" is the CPU time of the builds summed over the parallel workers. It prints a ratio line
(trials/min) and writes JSON (--out).

It also runs on code before the phase table existed (TuneResult without `phases`): the phases then come from
MetaSchedule's own profiler scopes (SendToBuilder as build, SendToRunner + JoinRunnerFutures as measure,
AddToDatabase as record), which is how the before/after figures in docs/BENCHMARKS-HISTORY.md were taken.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROWS = ["set-up", "search", "build", "measure", "record", "cost model", "generate", "inject", "other"]


def demo_ops(n: int) -> list[Any]:
    from core.demo import TINY_NETWORK
    from core.opconfigs.opconfig import parse_lines

    configs = [c for c in parse_lines(TINY_NETWORK, "demo").configs if c.op_type not in ("Relu", "Add")]
    return configs[:n]


def with_library_times(network: Any, target: str) -> Any:
    """Each op's cuDNN/cuBLAS time (bench_gpu.library_us: PyTorch, cold L2, as our kernels are timed), where a
    CUDA GPU and PyTorch are here; otherwise the network's library time stays "not measured"."""
    try:
        import torch

        on_gpu = target == "cuda" and torch.cuda.is_available()
    except ImportError:
        on_gpu = False
    if not on_gpu:
        return network
    sys.path.insert(0, str(REPO / "bench"))
    from bench_gpu import NoLibraryTwin, library_us

    ops = []
    for op in network.ops:
        try:
            us = library_us(op.config.op_type, op.config.params, dtype=op.config.dtype)  # fp16 ops: PyTorch's fp16
        except NoLibraryTwin as exc:  # ResNet-50's lone Add: no library time, the op is tuned all the same
            print(f"no library time: {exc}", flush=True)
            ops.append(op)
            continue
        ops.append(dataclasses.replace(op, library_seconds=us * 1e-6))
    return dataclasses.replace(network, ops=ops)


def model_network(path: Path) -> Any:
    """The model's ops as one network, as the settings' compiler imports it (after its ONNX Runtime pre-pass,
    where that runs)."""
    from core.nnfusion.compiler import compiler_prepass
    from core.settings import load_settings
    from core.tuning.network import network_from_model

    return network_from_model(path, prepass=compiler_prepass("", load_settings().nnfusion_path))


def shard_of(network: Any, spec: str) -> Any:
    """Shard K of N (1-based): the ops sorted by FLOPs x count, dealt out in turn, so each shard gets a like
    share of the work."""
    k, n = (int(x) for x in spec.split("/"))
    if not 1 <= k <= n:
        raise SystemExit(f"--shard {spec}: want K/N with 1 <= K <= N")
    ranked = sorted(network.ops, key=lambda op: op.config.flops * op.count, reverse=True)
    return dataclasses.replace(network, ops=ranked[k - 1 :: n])


def op_table(db_path: Path, network: Any) -> list[dict]:
    """Each op's injected kernels against the library: our GPU job's profile of the best and the efficient row
    (the timing method of bench_gpu.library_us), the library's time, the ratio; printed with the geometric mean
    over the convolutions. Not measured where the row or the library time is missing."""
    from core.codegen.generate import kernel_name
    from core.db.kernel_db import KernelDB

    if network is None or not db_path.exists():
        return []
    profiles: dict[str, float] = {}
    with KernelDB.open(db_path) as db:
        for row in db.iter_rows():
            kdb = json.loads(row.miscs).get("kdb", {})
            for entry in kdb.get("profile", {}).values():  # a DB of several runs: the fastest of a name's rows
                name = kdb.get("name", "")
                profiles[name] = min(entry["us"], profiles.get(name, entry["us"]))
    rows = []
    for op in network.ops:
        name = kernel_name(op.config)
        stem = name.removesuffix("_kernel0")  # the best row, or a runner-up's (best2...) if that one runs faster
        best = min((us for n, us in profiles.items() if re.fullmatch(re.escape(stem) + r"_best\d*_kernel0", n)),
                   default=None)
        efficient = profiles.get(name.replace("_kernel0", "_efficient_kernel0"))
        library = op.library_seconds * 1e6 if op.library_seconds else None
        rows.append({"op": op.config.describe(), "op_type": op.config.op_type, "count": op.count, "kernel": stem,
                     "best_us": best,
                     "efficient_us": efficient, "library_us": library,
                     "ratio": best / library if best and library else None})
    print_op_rows(rows)
    return rows


def print_op_rows(rows: list[dict]) -> float | None:
    """The op table and the geometric mean of row/library over the convolutions (returned; None: none measured)."""
    import math

    def cell(v: float | None, fmt: str = "8.1f") -> str:
        return format(v, fmt) if v is not None else "   -"

    print(f"{'op':<88} {'x':>2} {'best us':>8} {'effic us':>8} {'cuDNN us':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['op'][:88]:<88} {r['count']:>2} {cell(r['best_us'])} {cell(r['efficient_us'])} "
              f"{cell(r['library_us'])} {cell(r['ratio'], '6.2f')}")
    ratios = [r["ratio"] for r in rows if r["ratio"] and "Convolution" in r.get("op_type", r["op"].split(" ")[0])]
    if not ratios:
        return None
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    print(f"convolutions: geometric mean {geo:.2f}x the library over {len(ratios)} (target <= 0.6x)")
    return geo


def fastest_library(picks: list[list[dict]]) -> list[dict]:
    """One op table from several timings of the same DB's rows against the library, each in its own process:
    each op's library time is its fastest (cudnn.benchmark picks its algorithm anew in each process, by warm
    runs, and we time cold: the same convolution took 26.8 or 15.4 us on the H200 by the pick). Counting the
    library at its best is the fair comparison. The rows' times must agree: they are read, not timed."""
    if not picks:
        return []
    first = picks[0]
    for other in picks[1:]:
        if [(r["op"], r["best_us"]) for r in other] != [(r["op"], r["best_us"]) for r in first]:
            raise ValueError("the picks were not taken on the same DB: their rows differ")
    rows = []
    for i, row in enumerate(first):
        times = [p[i]["library_us"] for p in picks if p[i]["library_us"]]
        library = min(times) if times else None
        rows.append({**row, "library_us": library, "library_picks_us": times,
                     "ratio": row["best_us"] / library if row["best_us"] and library else None})
    return rows


def profiler_phases(scopes: dict[str, float], total: float) -> dict[str, float]:
    """The phase table from MetaSchedule's profiler alone (code without kdb's own phase clock)."""
    phases = {"search": sum(v for k, v in scopes.items() if k.startswith("EvoSearch/")),
              "build": scopes.get("SendToBuilder", 0.0),
              "measure": scopes.get("SendToRunner", 0.0) + scopes.get("JoinRunnerFutures", 0.0),
              "record": scopes.get("MeasureCallback/AddToDatabase", 0.0),
              "cost model": scopes.get("MeasureCallback/UpdateCostModel", 0.0)}
    phases["other"] = max(0.0, total - sum(phases.values()))  # set-up included: no clock for it there
    return phases


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=["llvm", "cuda"], default="llvm")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--ops", type=int, default=3, help="how many of the demo network's looked-up ops")
    ap.add_argument("--model", type=Path, help="tune this ONNX model's ops as a network instead")
    ap.add_argument("--resnet", metavar="18|34|50", choices=["18", "34", "50"],
                    help="tune ResNet-18/34/50 at batch 1 (224x224, BN folded; built here with onnx) as a network")
    ap.add_argument("--trials", type=int, default=16, help="per op (a model: per op on average)")
    ap.add_argument("--batch", type=int, default=8, help="candidates per MetaSchedule batch")
    ap.add_argument("--workers", type=int, help="parallel builds (default: sized to the host)")
    ap.add_argument("--overlap", choices=["auto", "on", "off"], default="auto", help="build while measuring")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "tune_phases.json")
    ap.add_argument("--state", type=Path, help="state dir to keep (work dirs, tuned.db): a second run resumes "
                                               "from it (default: a fresh temporary one)")
    ap.add_argument("--progress", type=Path, help="append each job's and the network's events here (JSON lines)")
    ap.add_argument("--shard", metavar="K/N", help="a model: tune only shard K of N (ops dealt by FLOPs x count, "
                                                   "largest first), so N processes can tune one network side by side")
    ap.add_argument("--max-per-op", type=int, metavar="N", help="a model: at most N trials per op (the spread's cap)")
    ap.add_argument("--join", metavar="RUN", help="a model: tune it with every other process given the same RUN and "
                    "--state, each op going to the first process that claims it (core/tuning/claims.py); the "
                    "budget is the whole network's")
    ap.add_argument("--no-transfer", action="store_true",
                    help="MetaSchedule's own cost model per op instead of one per process warm-started from the "
                         "records on disk (core/tuning/costmodel.py)")
    ap.add_argument("--minutes", type=float, help="a time budget (kdb tune --minutes): the op in flight then keeps "
                    "its best, ops not started are left")
    ap.add_argument("--report-only", action="store_true",
                    help="a model, cuda: tune nothing; time the library now (this process alone on the GPU) and "
                         "print the --state's tuned rows against it")
    ap.add_argument("--population", type=int,
                    help="the evolutionary search's population (default: core.tuning.job.search_population's)")
    args = ap.parse_args()
    os.environ["KDB_STATE_DIR"] = str(args.state) if args.state else tempfile.mkdtemp(prefix="kdb-bench-tune-")

    from tvm.s_tir import meta_schedule as ms

    from core.tuning.job import TuneJob
    from core.tuning.queue import run_queue

    fields = {f.name for f in dataclasses.fields(TuneJob)}
    extra: dict[str, Any] = {"overlap": {"on": True, "off": False}[args.overlap]} if args.overlap != "auto" else {}
    if extra and "overlap" not in fields:
        raise SystemExit("--overlap: this code has no overlap setting")
    if args.no_transfer:
        if "transfer" not in fields:
            raise SystemExit("--no-transfer: this code has no shared cost model")
        extra["transfer"] = False
    if args.population:
        if "population" not in fields:
            raise SystemExit("--population: this code has no population setting")
        extra["population"] = args.population

    def make_job(config: Any, trials: int) -> Any:
        return TuneJob(config, trials=trials, target=args.target, arch=args.arch, trials_per_batch=args.batch,
                       builder_workers=args.workers, builder_timeout_s=120, seed=1, **extra)

    inject = None
    if args.target == "cuda":
        from core.inject.pipeline import InjectOptions

        inject = InjectOptions(archs=(args.arch,), compile=True, workers=os.cpu_count() or 1, verify=True,
                               profile=True, gpu_timeout_s=120)
    db_path = Path(os.environ["KDB_STATE_DIR"]) / "tuned.db"
    if args.resnet:
        sys.path.insert(0, str(REPO / "tests"))
        from onnx_models import resnet, write

        blocks = {"18": (2, 2, 2, 2), "34": (3, 4, 6, 3), "50": (3, 4, 6, 3)}[args.resnet]
        args.model = write(resnet(blocks=blocks, bottleneck=args.resnet == "50"),
                           Path(os.environ["KDB_STATE_DIR"]) / f"resnet{args.resnet}.onnx")
    try:  # TVM's own output into a file, so the table stands alone (older code: it stays on the terminal)
        from core.tuning.tvm_log import capture_output

        quiet: Any = capture_output(Path(os.environ["KDB_STATE_DIR"]) / "tvm.log")
    except ImportError:
        quiet = contextlib.nullcontext()
    start = time.perf_counter()
    last_network = [0.0]

    def log_event(event: Any) -> None:
        """Job events, and the network's prediction at most every 10 s, to --progress as they come."""
        if args.progress is None:
            return
        now = time.perf_counter() - start
        if hasattr(event, "status"):
            line = {"t": now, "job": event.job, "status": event.status, "detail": event.detail}
        elif now - last_network[0] >= 10:
            last_network[0] = now
            line = {"t": now, "network": event.text()}
        else:
            return
        with args.progress.open("a") as f:
            f.write(json.dumps(line) + "\n")

    from core.tuning.queue import time_budget

    out_of_time = time_budget(args.minutes)
    if args.report_only:
        if not args.model or args.target != "cuda":
            raise SystemExit("--report-only: a --model on --target cuda")
        network = with_library_times(model_network(args.model), "cuda")
        per_op = op_table(db_path, network)
        out = args.out / "ops.json" if args.out.is_dir() else args.out
        out.write_text(json.dumps({"db": str(db_path), "per_op": per_op}, indent=1))
        return
    with quiet, ms.Profiler() as profiler:
        if args.model:
            from core.tuning.queue import run_network

            network = model_network(args.model)
            if args.shard:
                network = shard_of(network, args.shard)
            network = with_library_times(network, args.target)
            board = None
            if args.join:
                from core.tuning.claims import ClaimBoard

                board = ClaimBoard.for_run(args.join)
            report = run_network(network, args.trials * len(network.ops), make_job, db_path=db_path,
                                 inject_options=inject, on_job=log_event, on_network=log_event,
                                 cap=args.max_per_op, board=board, out_of_time=out_of_time)
        else:
            report = run_queue([make_job(c, args.trials) for c in demo_ops(args.ops)], db_path=db_path,
                               inject_options=inject, on_job=log_event, out_of_time=out_of_time)
    wall = time.perf_counter() - start
    scopes = {str(k): float(v) for k, v in profiler.get().items()}
    results = report.results
    new = sum(r.new_trials for r in results)
    tuning = sum(r.seconds for r in results)
    if all(getattr(r, "phases", None) for r in results):
        source = "kdb's phase clock"
        phases = {row: sum(r.phases.get(row, 0.0) for r in results) for row in ROWS}
        phases["other"] = max(0.0, wall - sum(v for k, v in phases.items() if k != "other"))
        build_cpu = sum(r.phases.get("build workers", 0.0) for r in results)
    else:
        source = "MetaSchedule's profiler (set-up counted in other)"
        phases = profiler_phases(scopes, wall)
        build_cpu = None
    print(f"{len(results)} ops, {new} trials on {args.target}, batches of {args.batch}; phases from {source}")
    print(f"{'phase':<14} {'seconds':>9} {'share':>7} {'ms/trial':>9}")
    for row in ROWS:
        if row in phases:
            seconds = phases[row]
            print(f"{row:<14} {seconds:9.1f} {seconds / wall:7.0%} {seconds / max(new, 1) * 1e3:9.0f}")
    print(f"{'total':<14} {wall:9.1f} {1:7.0%} {wall / max(new, 1) * 1e3:9.0f}")
    if build_cpu is not None:
        print(f"build workers: {build_cpu:.1f} CPU s in the parallel builds ({build_cpu / max(new, 1) * 1e3:.0f} "
              f"ms per candidate)")
    for r in results:
        print(f"  {r.job.name}: {r.new_trials} trials in {r.seconds:.1f} s, best "
              + (f"{r.best_seconds * 1e6:.2f} us" if r.best_seconds else "-")
              + (f"; search {r.search}, the model had {r.model_trials} trials" if getattr(r, "search", "") else ""))
    per_op = op_table(db_path, network if args.model else None) if args.target == "cuda" else []
    if getattr(report, "network", None) is not None:
        print(f"network {report.network.text()}")
    if report.failures:
        print(f"failures: {report.failures}")
    if report.out_of_time:
        print(f"the time budget ({args.minutes:g} min) ran out: the op in flight kept its best, ops not started left")
    print(f"ratio: {new / (wall / 60):.1f} trials/min over the whole run ({new} trials in {wall:.1f} s; "
          f"{new / (tuning / 60) if tuning else 0:.1f}/min in the tuning jobs alone)")
    out = args.out / "tune_phases.json" if args.out.is_dir() else args.out  # a folder: the file goes in it
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "source": source,
                                    "trials": new, "wall_s": wall, "phases_s": phases, "build_cpu_s": build_cpu,
                                    "metaschedule_scopes_s": scopes,
                                    "per_op": per_op,
                                    "network": dataclasses.asdict(report.network)
                                    if getattr(report, "network", None) else None,
                                    "jobs": [{"op": r.job.name, "trials": r.new_trials, "seconds": r.seconds,
                                              "best_us": (r.best_seconds or 0) * 1e6,
                                              "search": getattr(r, "search", ""),
                                              "model_trials": getattr(r, "model_trials", None)} for r in results]},
                                   indent=1))


if __name__ == "__main__":
    main()
