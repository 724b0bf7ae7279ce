"""A whole network through the real compiler on the GPU: ResNet-18 (torchvision) at batch 1.

Parts, each run on the GPU machine (see docs/BENCHMARKS.md for the commands and the figures):

    python3 bench/bench_network.py export   --out DIR      # ONNX (BN folded), input, float64 reference
    python3 bench/bench_network.py pytorch  --out DIR      # PyTorch eager and CUDA-graph latency
    python3 bench/bench_network.py tune     --out DIR --db DB --trials 448   # tune the ops NNFusion looks up
    python3 bench/bench_network.py nnfusion --out DIR --db DB --nnfusion BIN --label tuned
    python3 bench/bench_network.py ops      --out DIR --db DB   # each op's rows against cuDNN, timed now

and one on the CPU machine, before a device session (the `network` step's fallback DB, carried with the compiler):

    python3 bench/bench_network.py fallback --out .netrun/carry [--db .netrun/carry/kdb.db]

One timing method for every contender: the input already on the GPU, 100 warm-up iterations, then 1000
iterations each between its own pair of CUDA events on the stream the work runs on; the median. For NNFusion
that is a C++ driver around the generated project's kernel_entry (its own main_test copies the input from the
host inside every iteration). Output accuracy: max |out - ref| / max |ref| against the same network in float64.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WARMUP, ITERS = 100, 1000
INPUT = "input.bin"  # float32, [1, 3, 224, 224]
REFERENCE = "reference64.bin"  # float64 output of the same network


def torch_setup():  # type: ignore[no-untyped-def]
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    return torch


def resnet18():  # type: ignore[no-untyped-def]
    """torchvision's ResNet-18, seeded random weights, eval mode, every BatchNorm folded into its conv (as an
    inference export does): what NNFusion and PyTorch both run."""
    torch = torch_setup()
    import torchvision
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    # Random init leaves BN's running stats at 0/1: give them values so folding is not the identity.
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    pairs = [(model, "conv1", "bn1")]
    for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in stage:
            pairs += [(block, "conv1", "bn1"), (block, "conv2", "bn2")]
            if block.downsample is not None:
                pairs.append((block.downsample, "0", "1"))
    for owner, conv, bn in pairs:
        fused = fuse_conv_bn_eval(getattr(owner, conv), getattr(owner, bn))
        setattr(owner, conv, fused)
        setattr(owner, bn, torch.nn.Identity())
    return model


def part_export(out: Path) -> None:
    torch = torch_setup()
    import numpy as np

    model = resnet18()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    path = out / "resnet18.onnx"
    try:  # the TorchScript exporter writes plain Conv/Relu/Add/Flatten(axis=1)/Gemm at opset 13
        torch.onnx.export(model, (x,), str(path), opset_version=13, input_names=["input"], output_names=["logits"],
                          do_constant_folding=True, dynamo=False)
    except TypeError:
        torch.onnx.export(model, (x,), str(path), opset_version=13, input_names=["input"], output_names=["logits"],
                          do_constant_folding=True)
    x.numpy().astype(np.float32).tofile(out / INPUT)
    import copy

    with torch.no_grad():
        ref = copy.deepcopy(model).double()(x.double())
    ref.numpy().astype(np.float64).tofile(out / REFERENCE)
    print(f"exported {path} ({path.stat().st_size / 1e6:.1f} MB), input {INPUT}, float64 reference {REFERENCE}")


def cuda_event_median(torch, step, stream=None) -> dict:  # type: ignore[no-untyped-def]
    """The common method: warm-up, then each iteration between its own pair of events; the median (and spread)."""
    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(ITERS)]
    for start, stop in pairs:
        start.record(stream)
        step()
        stop.record(stream)
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in pairs)
    return {"median_ms": statistics.median(ms), "p10_ms": ms[ITERS // 10], "p90_ms": ms[ITERS * 9 // 10]}


def max_rel_err(out, ref) -> float:  # type: ignore[no-untyped-def]
    import numpy as np

    out, ref = np.asarray(out, dtype=np.float64).ravel(), np.asarray(ref, dtype=np.float64).ravel()
    return float(np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def part_pytorch(out: Path) -> None:
    torch = torch_setup()
    import numpy as np

    model = resnet18().cuda()
    x = torch.from_numpy(np.fromfile(out / INPUT, dtype=np.float32).reshape(1, 3, 224, 224)).cuda()
    ref = np.fromfile(out / REFERENCE, dtype=np.float64)
    results = {}
    with torch.no_grad():
        y = model(x)
        results["error"] = max_rel_err(y.cpu().numpy(), ref)
        results["eager"] = cuda_event_median(torch, lambda: model(x))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(x)
        results["cuda_graph"] = cuda_event_median(torch, graph.replay)
    results["device"] = torch.cuda.get_device_name(0)
    results["torch"] = torch.__version__
    (out / "pytorch.json").write_text(json.dumps(results, indent=1))
    print(f"PyTorch {torch.__version__} on {results['device']}, fp32 (TF32 off), cudnn.benchmark: "
          f"eager {results['eager']['median_ms']:.4f} ms, CUDA graph {results['cuda_graph']['median_ms']:.4f} ms "
          f"(median of {ITERS}); max rel err vs float64 {results['error']:.2e}")


def lookup_ops(model: Path):  # type: ignore[no-untyped-def]
    """The model's op configs that NNFusion looks up in the kernel DB at its default flags (convolutions, fused
    convolutions, pools, Dot; element-wise ops are fused into NNFusion's own kernels), with their counts."""
    from core.opconfigs.onnx_extract import extract

    ex = extract(model)
    return [(c, ex.count(c)) for c in ex.configs
            if c.op_type in ("Convolution", "Fused_Convolution_Relu", "Fused_Convolution_Add_Relu", "Dot",
                             "MaxPool", "AvgPool") and c.groups == 1]


def budget(ops, total: int, floor: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Trials per op by its share of the network's FLOPs (x count), at least `floor` each."""
    weights = [c.flops * n for c, n in ops]
    spare = max(total - floor * len(ops), 0)
    return [floor + int(spare * w / sum(weights)) for w in weights]


def part_tune(out: Path, db: Path, model: Path, total: int, floor: int) -> None:
    from core.inject.pipeline import InjectOptions
    from core.tuning.job import TuneJob
    from core.tuning.queue import run_queue

    ops = lookup_ops(model)
    trials = budget(ops, total, floor)
    jobs = [TuneJob(c, trials=t, arch="sm_90", builder_timeout_s=120, trials_per_batch=64,
                    builder_workers=os.cpu_count()) for (c, _), t in zip(ops, trials, strict=True)]
    for (c, n), t in zip(ops, trials, strict=True):
        print(f"  {t:4d} trials  x{n}  {c.describe()}  ({c.flops / 1e6:.0f} MFLOP)", flush=True)
    start = time.perf_counter()
    progress = out / "tune_progress.jsonl"

    def on_job(e) -> None:  # type: ignore[no-untyped-def]
        print(f"  [{time.perf_counter() - start:6.0f} s] {e.status}: {e.job}: {e.detail}", flush=True)
        with progress.open("a") as f:
            f.write(json.dumps({"t": time.perf_counter() - start, "job": e.job, "status": e.status,
                                "detail": e.detail}) + "\n")

    report = run_queue(jobs, db_path=db,
                       inject_options=InjectOptions(archs=("sm_90",), compile=True, workers=os.cpu_count() or 1,
                                                    verify=True, profile=True, gpu_timeout_s=120),
                       on_job=on_job)
    done = sum(r.new_trials for r in report.results)
    seconds = time.perf_counter() - start
    print(f"tuned {len(jobs)} ops, {done} new trials in {seconds:.0f} s ({done / max(seconds, 1) * 60:.0f} trials/min "
          f"including injection); failures: {report.failures or 'none'}")


DRIVER = r"""
// Times the generated network: input on the GPU once, kernel_entry between CUDA events, the median.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "nnfusion_rt.h"
#define CHECK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) {              \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(err_)); return 2; } } while (0)
int main(int argc, char** argv) {
    if (argc != 5) { fprintf(stderr, "usage: driver input.bin n_in output.bin n_out\n"); return 2; }
    size_t n_in = atol(argv[2]), n_out = atol(argv[4]);
    std::vector<float> host(n_in), result(n_out);
    FILE* f = fopen(argv[1], "rb");
    if (!f || fread(host.data(), 4, n_in, f) != n_in) { fprintf(stderr, "bad input\n"); return 2; }
    fclose(f);
    cuda_init();
    float* input; float* output = nullptr;
    CHECK(cudaMalloc(&input, n_in * 4));
    CHECK(cudaMemcpy(input, host.data(), n_in * 4, cudaMemcpyHostToDevice));
    for (int i = 0; i < WARMUP; ++i) kernel_entry(input, &output);
    CHECK(cudaDeviceSynchronize());
    std::vector<cudaEvent_t> ev(2 * ITERS);
    for (auto& e : ev) CHECK(cudaEventCreate(&e));
    for (int i = 0; i < ITERS; ++i) {
        cudaEventRecord(ev[2 * i], 0);
        kernel_entry(input, &output);
        cudaEventRecord(ev[2 * i + 1], 0);
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ms(ITERS);
    for (int i = 0; i < ITERS; ++i) cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
    CHECK(cudaMemcpy(result.data(), output, n_out * 4, cudaMemcpyDeviceToHost));
    f = fopen(argv[3], "wb"); fwrite(result.data(), 4, n_out, f); fclose(f);
    std::sort(ms.begin(), ms.end());
    printf("{\"median_ms\": %.6f, \"p10_ms\": %.6f, \"p90_ms\": %.6f}\n",
           ms[ITERS / 2], ms[ITERS / 10], ms[ITERS * 9 / 10]);
    cuda_free();
    return 0;
}
"""


def run_step(what: str, cmd: list[str], timeout_s: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """One step of a contender, its clock printed as soon as it ends; a step past `timeout_s` is killed and
    named (a network whose run hangs on the GPU says so instead of holding the device call)."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, **kw)
    except subprocess.TimeoutExpired as exc:
        tail = ((exc.stdout or b"") + (exc.stderr or b""))
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        raise SystemExit(f"{what}: no result in {timeout_s:.0f} s, stopped ({' '.join(cmd[:2])}); "
                         f"last output: {tail[-1500:]!r}") from None
    print(f"  {what}: exit {r.returncode} in {time.perf_counter() - t0:.1f} s", flush=True)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed ({r.returncode}): {' '.join(cmd)}\n{(r.stdout + r.stderr)[-3000:]}")
    return r


def trace_steps(source: str) -> str:
    """kernel_entry with a check after each step of its first call: synchronise, print the step's name and the
    CUDA status to stderr. A run that hangs then names the last step that finished (the next one hung)."""
    lines = source.split("\n")
    entry = next(i for i, line in enumerate(lines) if line.startswith('extern "C" int kernel_entry('))
    out, name, step = lines[:entry], "", 0
    for line in lines[entry:]:
        out.append(line)
        if line.startswith(" // name="):
            name = line.split("=", 1)[1]
        elif name and line.endswith(");") and "_Call(" in line:
            step += 1
            out.append(f'{{ static int kdb_seen = 0; if (!kdb_seen++) {{ cudaError_t e = cudaDeviceSynchronize(); '
                       f'fprintf(stderr, "step {step} {name}: %s\\n", cudaGetErrorString(e)); }} }}')
            name = ""
    return "#include <cstdio>\n" + "\n".join(out)


def part_nnfusion(out: Path, db: Path, model: Path, nnfusion: Path, label: str, flags: list[str],
                  trace: bool = False, runs: int = 1) -> None:
    import numpy as np

    torch = torch_setup()
    product = torch.cuda.get_device_name(0)
    work = out / f"nnfusion-{label}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(f"NNFusion [{label}] {' '.join(flags)}: {db}", flush=True)
    t0 = time.perf_counter()
    cmd = [str(nnfusion), str(model.resolve()), "-f", "onnx", f"-fkernel_cache_path={db.resolve()}",
           f"-fproduct_name={product}", *flags]
    log = run_step("compile (nnfusion)", cmd, 300, cwd=work)  # a failure's output tail is in its message
    (out / f"nnfusion-{label}.log").write_text(log.stdout + log.stderr)
    compile_s = time.perf_counter() - t0
    project = work / "nnfusion_rt" / "cuda_codegen"
    import nvidia.cudnn as cudnn_pkg

    cudnn = Path(next(iter(cudnn_pkg.__path__)))
    (project / "driver.cu").write_text(DRIVER.replace("WARMUP", str(WARMUP)).replace("ITERS", str(ITERS)))
    if trace:
        rt = project / "nnfusion_rt.cu"
        rt.write_text(trace_steps(rt.read_text()))
    t0 = time.perf_counter()
    common = ["-O2", "-gencode", "arch=compute_90,code=sm_90", "--expt-relaxed-constexpr", f"-I{cudnn}/include"]
    run_step("build (nvcc nnfusion_rt.cu)",
             ["nvcc", *common, "-Xcompiler", "-fPIC", "-shared", "-cudart", "shared", "nnfusion_rt.cu",
              "-o", "libnnfusion_naive_rt.so", f"-L{cudnn}/lib", "-l:libcudnn.so.9", "-l:libcublas.so.13"],
             600, cwd=project)
    run_step("build (nvcc driver.cu)",
             ["nvcc", *common, "-std=c++17", "driver.cu", "-o", "driver", "-L.", "-lnnfusion_naive_rt",
              "-cudart", "shared", "-Xlinker", "-rpath=$ORIGIN"], 300, cwd=project)
    build_s = time.perf_counter() - t0
    ref = np.fromfile(out / REFERENCE, dtype=np.float64)
    n_in = 1 * 3 * 224 * 224
    env = dict(os.environ, LD_LIBRARY_PATH=f"{project}:{cudnn}/lib:" + os.environ.get("LD_LIBRARY_PATH", ""))
    timings = []
    for k in range(runs):  # separate processes: the spread between runs (cuDNN's algorithm choice) shows
        r = run_step(f"run {k + 1}/{runs} ({WARMUP} warm-ups + {ITERS} timed iterations)",
                     ["./driver", str((out / INPUT).resolve()), str(n_in), "output.bin", str(ref.size)],
                     45, cwd=project, env=env)  # about 1.1 s of GPU work: more is a hang
        timings.append(json.loads(r.stdout.strip().splitlines()[-1]))
    # the run whose median is the median of the runs' medians; every run's median is kept
    timing = sorted(timings, key=lambda t: t["median_ms"])[(len(timings) - 1) // 2]
    timing["runs_median_ms"] = [t["median_ms"] for t in timings]
    output = np.fromfile(project / "output.bin", dtype=np.float32)
    source = (project / "nnfusion_rt.cu").read_text()
    result = {"label": label, "flags": flags, "product_name": product, "compile_s": compile_s, "build_s": build_s,
              "error": max_rel_err(output, ref), **timing,
              "library_calls": {"cudnn": source.count("cudnnConvolutionForward") + source.count("cudnnPoolingForward"),
                                "cublas": source.count("cublasSgemm")}}
    if db.exists():
        from core.nnfusion.usage import db_kernels_used

        result["db_kernels"] = db_kernels_used(db, source, product)
    from core.cuda.nvcc import find_nvcc
    from core.nnfusion.generated import parse_generated
    from core.nnfusion.launch_check import check_launches

    # the CPU-side launch check, beside what the GPU computed (a launch that cannot start leaves wrong numbers)
    launches = check_launches(source, parse_generated(source), "sm_90", nvcc=find_nvcc(""), workdir=work / "check")
    result["launch_check"] = launches.as_dict()
    for line in launches.reasons() or [launches.error or f"launch check: all {len(launches.launches)} launches fit"]:
        print(f"  {line}", flush=True)
    (out / f"nnfusion-{label}.json").write_text(json.dumps(result, indent=1))
    print(f"NNFusion [{label}] {' '.join(flags)}: {timing['median_ms']:.4f} ms median "
          f"(p10 {timing['p10_ms']:.4f}, p90 {timing['p90_ms']:.4f}); max rel err vs float64 {result['error']:.2e}; "
          f"library calls {result['library_calls']}; compile {compile_s:.1f} s, nvcc {build_s:.0f} s; "
          f"medians of the {runs} run(s): {', '.join(f'{m:.4f}' for m in timing['runs_median_ms'])} ms", flush=True)


def part_ops(out: Path, db: Path, model: Path, picks: int = 1, pick_out: Path | None = None) -> None:
    """Each of the model's looked-up ops: the DB's best and efficient rows (their GPU profile, from injection)
    against cuDNN/cuBLAS timed now, the same method; the geometric mean over the convolutions (bench_tune.op_table).
    With `picks` > 1 the library is timed in that many processes and each op counts its fastest
    (bench_tune.fastest_library)."""
    sys.path.insert(0, str(REPO / "bench"))
    from bench_tune import fastest_library, op_table, print_op_rows, with_library_times

    from core.tuning.network import network_from_model

    if picks <= 1:
        network = with_library_times(network_from_model(model), "cuda")
        rows = op_table(db, network)
        (pick_out or out / "ops.json").write_text(json.dumps(rows, indent=1))
        return
    runs = []
    for k in range(picks):  # each in a new process: a new cudnn.benchmark pick
        path = out / f"ops-pick-{k + 1}.json"
        subprocess.run([sys.executable, __file__, "ops", "--out", str(out), "--db", str(db), "--model", str(model),
                        "--pick-out", str(path)], check=True, stdout=subprocess.DEVNULL)
        runs.append(json.loads(path.read_text()))
    rows = fastest_library(runs)
    print(f"library: the fastest of {picks} processes' timings per op")
    print_op_rows(rows)
    (out / "ops.json").write_text(json.dumps(rows, indent=1))


def part_dbs(out: Path, tuned: Path, fallback: Path | None) -> None:
    """The DB variants the network is compiled with, from the tuned DB (table order matters: NNFusion takes an
    op's first row, and BlockFusion may swap in the row with the smallest time x resource):

        tuned-all    every tuned row (best and efficient), then the fallback's rows for ops tuning left out
        tuned-best   the same without the efficient rows (what BlockFusion gains from them)
    """
    import json as json_

    from core.db.fastest import apply_fastest, plan_fastest, profiled_devices
    from core.db.kernel_db import KernelDB
    from core.kernels.kernel_row import distinct_kernels

    with KernelDB.open(tuned) as db:  # table order: the order the compiler picks from
        rows = list(distinct_kernels(db.iter_table_order()))
    extra = []
    if fallback is not None:
        with KernelDB.open(fallback) as db:
            covered = {(r.identifier, r.device_type) for r in rows}
            extra = [r for r in distinct_kernels(db.iter_table_order())
                     if (r.identifier, r.device_type) not in covered]
    def best_only(row: Any) -> bool:
        return "_efficient_" not in json_.loads(row.miscs).get("kdb", {}).get("name", "")

    for label, keep in (("tuned-all", lambda r: True), ("tuned-best", best_only)):
        path = out / f"{label}.db"
        path.unlink(missing_ok=True)
        with KernelDB.open(path, create=True) as db:
            chosen = [r for r in rows if keep(r)] + extra
            for row in chosen:
                db.insert(row)
            fastest = ""
            devices = profiled_devices(db)
            if label == "tuned-best" and len(devices) == 1:  # rows of several runs: the compiler takes the first
                plan = plan_fastest(db, devices.pop())
                removed = apply_fastest(db, plan, out / "backups")
                fastest = f"; kept the fastest row of {len(plan.choices)} op(s), {len(removed)} rows removed"
        print(f"{path}: {sum(1 for r in rows if keep(r))} tuned rows + {len(extra)} fallback rows{fastest}")


def part_fallback(out: Path, db_path: Path) -> None:
    """On the CPU machine: kdb's default-schedule rows (TVM's default schedule, no tuning, no GPU) for
    ResNet-18's ops, the `network` step's fallback DB for ops a tuning left out. Built from the tests' ResNet-18,
    whose ops have the shapes of torchvision's; a fused op of another pattern simply finds no row."""
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "bench")]
    from bench_nnfusion import default_schedule_db
    from onnx_models import resnet, write

    model = write(resnet(blocks=(2, 2, 2, 2)), out / "resnet18-tests.onnx")
    print(f"{db_path}: {default_schedule_db(model, db_path, out / 'fallback-kernels.json')}")


def summary(out: Path) -> None:
    """The latency table of every contender measured into `out`."""
    rows = []
    pt = out / "pytorch.json"
    if pt.exists():
        p = json.loads(pt.read_text())
        rows += [("PyTorch eager (cuDNN)", p["eager"]["median_ms"], p["error"]),
                 ("PyTorch CUDA graph (cuDNN)", p["cuda_graph"]["median_ms"], p["error"])]
    for f in sorted(out.glob("nnfusion-*.json")):
        n = json.loads(f.read_text())
        rows.append((f"NNFusion, {n['label']} DB", n["median_ms"], n["error"]))
    base = next((ms for name, ms, _ in rows if name == "NNFusion, empty DB"), None)
    print(f"{'contender':34s} {'median ms':>10s} {'vs empty DB':>12s} {'max rel err':>12s}")
    for name, ms, err in rows:  # no empty DB measured into `out` (CONTENDERS left it out): no ratio to it
        ratio = f"{ms / base:11.2f}x" if base else f"{'-':>12s}"
        print(f"{name:34s} {ms:10.4f} {ratio} {err:12.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["export", "pytorch", "tune", "dbs", "nnfusion", "ops", "summary", "fallback"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--db", type=Path)
    ap.add_argument("--model", type=Path, help="default: OUT/resnet18.onnx")
    ap.add_argument("--trials", type=int, default=448, help="tune: trials for the whole network")
    ap.add_argument("--floor", type=int, default=16, help="tune: at least this many trials per op")
    ap.add_argument("--nnfusion", type=Path, default=Path(shutil.which("nnfusion") or "nnfusion"))
    ap.add_argument("--label", default="tuned")
    ap.add_argument("--fallback", type=Path, help="dbs: rows for the ops the tuned DB lacks (kdb's default kernels)")
    ap.add_argument("--flag", action="append", default=[], help="nnfusion: an extra compiler flag (repeatable)")
    ap.add_argument("--trace-steps", action="store_true",
                    help="nnfusion: synchronise and name each step of the first call (finds the step that hangs)")
    ap.add_argument("--picks", type=int, default=1,
                    help="ops: time the library in this many processes, each op counting its fastest")
    ap.add_argument("--pick-out", type=Path, help=argparse.SUPPRESS)  # ops: one pick's table (the parent merges)
    ap.add_argument("--runs", type=int, default=1,
                    help="nnfusion: run the timing this many times, each in a new process; the median run counts")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or args.out / "resnet18.onnx"
    if args.part == "export":
        part_export(args.out)
    elif args.part == "pytorch":
        part_pytorch(args.out)
    elif args.part == "tune":
        part_tune(args.out, args.db, model, args.trials, args.floor)
    elif args.part == "dbs":
        part_dbs(args.out, args.db, args.fallback)
    elif args.part == "nnfusion":
        part_nnfusion(args.out, args.db, model, args.nnfusion, args.label, args.flag, args.trace_steps, args.runs)
    elif args.part == "ops":
        part_ops(args.out, args.db, model, args.picks, args.pick_out)
    elif args.part == "fallback":
        part_fallback(args.out, args.db or args.out / "kdb.db")
    else:
        summary(args.out)


if __name__ == "__main__":
    main()
