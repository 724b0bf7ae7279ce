"""Whole networks through the real compiler on the GPU: ResNet-18 and ResNet-50 (torchvision) at batch 1.

Parts, each run on the GPU machine (see docs/BENCHMARKS-HISTORY.md for the commands and the figures); `--net resnet50`
picks the network (default resnet18), whose files are OUT/NET.onnx, OUT/input.bin and OUT/reference64.bin:

    python3 bench/bench_network.py export   --out DIR [--net N]   # ONNX (BN folded), input, float64 reference
    python3 bench/bench_network.py pytorch  --out DIR [--net N] [--modes eager,graph,compile] [--runs 3]
                                                                  # PyTorch eager, CUDA graph, torch.compile
    python3 bench/bench_network.py tune     --out DIR --db DB --trials 448   # tune the ops NNFusion looks up
    python3 bench/bench_network.py nnfusion --out DIR --db DB --nnfusion BIN --label tuned [--tf32-off-runs 3]
    python3 bench/bench_network.py ops      --out DIR --db DB   # each op's rows against cuDNN, timed now
    python3 bench/bench_network.py table    --out DIR           # every contender measured into DIR, one table

and one on the CPU machine, before a device session (the `network` step's fallback DB, carried with the compiler):

    python3 bench/bench_network.py fallback --out .netrun/carry [--db .netrun/carry/kdb.db]

One timing method for every contender: the input already on the GPU, 100 warm-up iterations, then 1000
iterations each between its own pair of CUDA events on the stream the work runs on; the median. For NNFusion
that is a C++ driver around the generated project's kernel_entry (its own main_test copies the input from the
host inside every iteration). Output accuracy: max |out - ref| / max |ref| against the same network in float64.
Each contender runs in `--runs` processes (cuDNN picks its algorithms anew in each): the median run counts, every
run's median is kept. The NNFusion driver also times the GPU alone (iterations queued behind a spin kernel, so
the host's launch cost is hidden) and the host's cost of one kernel_entry call, and logs the algorithm cuDNN's
Find chose for each convolution in each process (the empty DB's 2x swing between sessions 12 and 14).
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


NETS = ("resnet18", "resnet50")


def torchvision_resnet(net: str):  # type: ignore[no-untyped-def]
    """torchvision's ResNet-18 or ResNet-50 (v1.5: the stride on the 3x3), seeded random weights, eval mode,
    every BatchNorm folded into its conv (as an inference export does): what NNFusion and PyTorch both run."""
    torch = torch_setup()
    import torchvision
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    if net not in NETS:
        raise SystemExit(f"--net {net}: not one of {', '.join(NETS)}")
    torch.manual_seed(0)
    model = getattr(torchvision.models, net)(weights=None).eval()
    # Random init leaves BN's running stats at 0/1: give them values so folding is not the identity.
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    pairs = [(model, "conv1", "bn1")]
    for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in stage:  # BasicBlock: conv1/bn1, conv2/bn2; Bottleneck: conv3/bn3 too
            pairs += [(block, f"conv{i}", f"bn{i}") for i in (1, 2, 3) if hasattr(block, f"conv{i}")]
            if block.downsample is not None:
                pairs.append((block.downsample, "0", "1"))
    for owner, conv, bn in pairs:
        fused = fuse_conv_bn_eval(getattr(owner, conv), getattr(owner, bn))
        setattr(owner, conv, fused)
        setattr(owner, bn, torch.nn.Identity())
    left = [name for name, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    if left:  # a BatchNorm left unfolded would run in PyTorch but be folded by nobody else
        raise SystemExit(f"{net}: BatchNorm not folded: {', '.join(left)}")
    return model


def part_export(out: Path, net: str) -> None:
    torch = torch_setup()
    import numpy as np

    model = torchvision_resnet(net)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    path = out / f"{net}.onnx"
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


PYTORCH_MODES = {  # mode: (its key in pytorch.json, what one timed iteration holds)
    "eager": ("eager", "model(x): Python, PyTorch's dispatch and each cuDNN/cuBLAS call, launched one by one"),
    "graph": ("cuda_graph", "graph.replay(): one launch of the CUDA graph captured from model(x)"),
    "compile": ("compile_max_autotune", "compiled(x), torch.compile(mode='max-autotune'): the guards, the copy of x "
                "into the CUDA graph's static input, one replay of Inductor's graph (Triton and cuDNN/cuBLAS "
                "kernels it autotuned)"),
}


def pytorch_step(torch, model, x, mode: str):  # type: ignore[no-untyped-def]
    """One timed iteration of a PyTorch contender, everything its first calls prepare done: returns the output."""
    if mode == "eager":
        return lambda: model(x)
    if mode == "graph":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(x)

        def replay():  # type: ignore[no-untyped-def]
            graph.replay()
            return static_out
        return replay
    if mode == "compile":
        compiled = torch.compile(model, mode="max-autotune")
        for _ in range(3):  # compile and autotune, then record the CUDA graph (cudagraph trees: a later call)
            compiled(x)
        return lambda: compiled(x)
    raise SystemExit(f"--modes: {mode} is not one of {', '.join(PYTORCH_MODES)}")


def pytorch_one(out: Path, net: str, modes: list[str]) -> dict[str, dict]:
    """PyTorch contenders timed in this process, one after the other on one model (fp32, TF32 off,
    cudnn.benchmark): the common method. Returns each mode's figures."""
    torch = torch_setup()
    import numpy as np

    torch.set_float32_matmul_precision("highest")  # torch.compile's matmuls too: no TF32
    model = torchvision_resnet(net).cuda()
    x = torch.from_numpy(np.fromfile(out / INPUT, dtype=np.float32).reshape(1, 3, 224, 224)).cuda()
    ref = np.fromfile(out / REFERENCE, dtype=np.float64)
    results = {}
    for mode in modes:
        t0 = time.perf_counter()
        with torch.no_grad():
            step = pytorch_step(torch, model, x, mode)
            step()
            torch.cuda.synchronize()
            setup_s = time.perf_counter() - t0
            timing = cuda_event_median(torch, step)
            y = step().clone()  # a CUDA graph's output is overwritten by the next replay: copied first
            torch.cuda.synchronize()
        results[mode] = {"mode": mode, "net": net, "setup_s": setup_s, "error": max_rel_err(y.cpu().numpy(), ref),
                         **timing, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                         "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32,
                                  "cudnn": torch.backends.cudnn.allow_tf32}}
    return results


def part_pytorch(out: Path, net: str, modes: list[str], runs: int, timeout_s: float) -> None:
    """The modes timed in `runs` processes each (cudnn.benchmark picks anew in each): eager and graph share a
    process, torch.compile has its own (its later processes find the first one's compiled code and autotuning
    choices in Inductor's cache, /tmp/torchinductor_$USER). The median run counts. A process that fails or runs
    past `timeout_s` is recorded as such and the others go on."""
    unknown = [m for m in modes if m not in PYTORCH_MODES]
    if unknown:
        raise SystemExit(f"--modes: {', '.join(unknown)} not among {', '.join(PYTORCH_MODES)}")
    groups = [g for g in ([m for m in modes if m != "compile"], [m for m in modes if m == "compile"]) if g]
    path = out / "pytorch.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for group in groups:
        timings: dict[str, list[dict]] = {m: [] for m in group}
        failures: list[str] = []
        for k in range(runs):
            pick = out / f"pytorch-{'-'.join(group)}-{k + 1}.json"
            pick.unlink(missing_ok=True)
            cmd = [sys.executable, __file__, "pytorch-one", "--out", str(out), "--net", net, "--modes", ",".join(group),
                   "--pick-out", str(pick)]
            t0 = time.perf_counter()
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                failures.append(f"run {k + 1}: no result in {timeout_s:.0f} s")
                print(f"  PyTorch {'+'.join(group)} run {k + 1}/{runs}: no result in {timeout_s:.0f} s, stopped",
                      flush=True)
                break  # a compile that ran past its time once will again
            print(f"  PyTorch {'+'.join(group)} run {k + 1}/{runs}: exit {r.returncode} in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
            if r.returncode != 0 or not pick.exists():
                failures.append(f"run {k + 1}: exit {r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
                print(failures[-1], flush=True)
                continue
            for mode, timing in json.loads(pick.read_text()).items():
                timings[mode].append(timing)
        for mode in group:
            key, region = PYTORCH_MODES[mode]
            if not timings[mode]:
                results[key] = {"failed": failures, "timed_region": region}
                continue
            runs_ = timings[mode]
            timing = dict(sorted(runs_, key=lambda t: t["median_ms"])[(len(runs_) - 1) // 2])
            timing.update(runs_median_ms=[t["median_ms"] for t in runs_], runs_error=[t["error"] for t in runs_],
                          runs_setup_s=[t["setup_s"] for t in runs_], failed=failures, timed_region=region)
            results[key] = timing
            results.update(device=timing["device"], torch=timing["torch"])
            if mode == "eager":
                results["error"] = timing["error"]  # the older table's one error column: eager's
            print(f"PyTorch {timing['torch']} [{net}] {mode}: {timing['median_ms']:.4f} ms median (p10 "
                  f"{timing['p10_ms']:.4f}, p90 {timing['p90_ms']:.4f}); medians of the {len(runs_)} run(s): "
                  f"{', '.join(f'{m:.4f}' for m in timing['runs_median_ms'])} ms; set-up "
                  f"{', '.join(f'{s:.1f}' for s in timing['runs_setup_s'])} s; max rel err vs float64 "
                  f"{timing['error']:.2e}", flush=True)
        path.write_text(json.dumps(results, indent=1))  # each group kept as soon as it is there


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
// Then the GPU alone: chunks of iterations queued behind a spin kernel, so the GPU runs them back to back
// whatever the host's cost of a call; and that host cost, the wall time of enqueuing them.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "nnfusion_rt.h"
#define CHECK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) {              \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(err_)); return 2; } } while (0)
__global__ void kdb_spin(unsigned long long ns) {  // holds the stream for ns of GPU time
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
static float at(std::vector<float>& v, double q) { return v[(size_t)(q * (v.size() - 1) + 0.5)]; }
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
    CHECK(cudaGetLastError());
    std::vector<float> ms(ITERS);
    for (int i = 0; i < ITERS; ++i) CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    CHECK(cudaMemcpy(result.data(), output, n_out * 4, cudaMemcpyDeviceToHost));
    f = fopen(argv[3], "wb"); fwrite(result.data(), 4, n_out, f); fclose(f);
    std::sort(ms.begin(), ms.end());
    // The GPU alone: CHUNKS x CHUNK iterations, each chunk queued while a spin kernel holds the stream (twice
    // the chunk's time as timed above, which is at least the host's cost of enqueuing it).
    const int CHUNK = 10, CHUNKS = 30;
    const double SPIN_MS = std::max(20.0, 2.0 * CHUNK * ms[ITERS / 2]);
    std::vector<float> gpu;
    std::vector<float> host_ms;
    int overran = 0;  // chunks whose enqueuing outlasted the spin: their events partly time the host
    for (int c = 0; c < CHUNKS; ++c) {
        kdb_spin<<<1, 1>>>((unsigned long long)(SPIN_MS * 1e6));
        auto h0 = std::chrono::steady_clock::now();
        for (int j = 0; j < CHUNK; ++j) {
            cudaEventRecord(ev[2 * j], 0);
            kernel_entry(input, &output);
            cudaEventRecord(ev[2 * j + 1], 0);
        }
        double enq = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
        host_ms.push_back((float)(enq / CHUNK));
        if (enq > 0.9 * SPIN_MS) ++overran;
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaGetLastError());
        for (int j = 0; j < CHUNK; ++j) {
            float t;
            CHECK(cudaEventElapsedTime(&t, ev[2 * j], ev[2 * j + 1]));
            gpu.push_back(t);
        }
    }
    std::sort(gpu.begin(), gpu.end()); std::sort(host_ms.begin(), host_ms.end());
    printf("{\"median_ms\": %.6f, \"p10_ms\": %.6f, \"p90_ms\": %.6f, \"gpu_only_median_ms\": %.6f, "
           "\"gpu_only_p10_ms\": %.6f, \"gpu_only_p90_ms\": %.6f, \"host_call_median_ms\": %.6f, "
           "\"gpu_only_chunks_overran\": %d}\n",
           ms[ITERS / 2], ms[ITERS / 10], ms[ITERS * 9 / 10], at(gpu, 0.5), at(gpu, 0.1), at(gpu, 0.9),
           at(host_ms, 0.5), overran);
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


FIND_LOG = "kdb-cudnn-find"


def log_cudnn_choices(source: str) -> tuple[str, int]:
    """The generated source with each convolution's first call printing, to stderr, what cuDNN's Find measured
    and which algorithm it chose (NNFusion's cuDNN convolutions pick theirs once per process, by
    cudnnFindConvolutionForwardAlgorithm): one line per convolution function. Returns the source and how many
    convolutions print; 0 where the source has no Find (a DB-only network)."""
    import re

    lines, out, function, count = source.split("\n"), [], "", 0
    for line in lines:
        out.append(line)
        m = re.match(r"void (\w+)\(cudnnHandle_t ", line)
        if m:
            function = m.group(1)
        elif line.strip() == "selected_algo = true;" and function:
            count += 1  # inside `if (!selected_algo)`: results[] holds Find's answers, conv_fwd_algo the pick
            out.append(f'        fprintf(stderr, "{FIND_LOG} {function} chose=%d", (int)conv_fwd_algo);')
            out.append('        for (size_t k = 0; k != results.size(); ++k) fprintf(stderr, " %d:%d:%.4f:%zu:%d", '
                       "(int)results[k].algo, (int)results[k].status, results[k].time, results[k].memory, "
                       "(int)results[k].mathType);")
            out.append('        fprintf(stderr, "\\n");')
    text = "\n".join(out)
    return ("#include <cstdio>\n" + text if count else text), count


def parse_find_log(stderr: str) -> dict[str, dict]:
    """The lines log_cudnn_choices prints: per convolution function, the chosen algorithm and Find's list
    (algo, status, ms, workspace bytes, math type: 0 default (TF32 allowed), 1 tensor op, 2 tensor op with
    conversion, 3 FMA)."""
    found = {}
    for line in stderr.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[0] != FIND_LOG:
            continue
        results = []
        for item in parts[3:]:
            algo, status, ms, memory, math = item.split(":")
            results.append({"algo": int(algo), "status": int(status), "ms": float(ms), "memory": int(memory),
                            "math": int(math)})
        found[parts[1]] = {"chose": int(parts[2].removeprefix("chose=")), "find": results}
    return found


def part_nnfusion(out: Path, db: Path, model: Path, nnfusion: Path, label: str, flags: list[str],
                  trace: bool = False, runs: int = 1, tf32_off_runs: int = 0) -> None:
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
    rt = project / "nnfusion_rt.cu"
    source = rt.read_text()  # as NNFusion wrote it: what the counts below read
    instrumented, finds = log_cudnn_choices(source)
    if trace:
        instrumented = trace_steps(instrumented)
    rt.write_text(instrumented)
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

    def timed_runs(count: int, what: str, run_env: dict[str, str]) -> list[dict]:
        """`count` runs, each a new process (cuDNN's Find picks anew in each): timings, error, Find's picks."""
        timings = []
        for k in range(count):
            (project / "output.bin").unlink(missing_ok=True)
            r = run_step(f"run {k + 1}/{count}{what} ({WARMUP} warm-ups + {ITERS} timed iterations, then the GPU "
                         "alone)", ["./driver", str((out / INPUT).resolve()), str(n_in), "output.bin", str(ref.size)],
                         60, cwd=project, env=run_env)  # about 1-5 s of GPU work: more is a hang
            timing = json.loads(r.stdout.strip().splitlines()[-1])
            timing["error"] = max_rel_err(np.fromfile(project / "output.bin", dtype=np.float32), ref)
            timing["cudnn_find"] = parse_find_log(r.stderr)
            timings.append(timing)
        return timings

    def median_run(timings: list[dict]) -> dict:
        """The run whose median is the median of the runs' medians; every run's figures are kept beside it."""
        timing = dict(sorted(timings, key=lambda t: t["median_ms"])[(len(timings) - 1) // 2])
        for key in ("median_ms", "gpu_only_median_ms", "host_call_median_ms", "error"):
            timing[f"runs_{key}"] = [t[key] for t in timings]
        timing["runs_cudnn_find"] = [t.pop("cudnn_find") for t in timings]
        timing.pop("cudnn_find", None)
        return timing

    timing = median_run(timed_runs(runs, "", env))
    result = {"label": label, "flags": flags, "product_name": product, "compile_s": compile_s, "build_s": build_s,
              **timing, "convolutions_logging_find": finds,
              "library_calls": {"cudnn": source.count("cudnnConvolutionForward") + source.count("cudnnPoolingForward"),
                                "cublas": source.count("cublasSgemm")}}
    if tf32_off_runs and finds + source.count("cublasSgemm"):  # a library call may use TF32: the same binary again,
        result["tf32_off"] = median_run(  # with NVIDIA's switch that turns TF32 off in cuDNN and cuBLAS
            timed_runs(tf32_off_runs, " NVIDIA_TF32_OVERRIDE=0", dict(env, NVIDIA_TF32_OVERRIDE="0")))
    if db.exists():
        from core.nnfusion.usage import db_kernels_used

        result["db_kernels"] = db_kernels_used(db, source, product)
    from core.cuda.nvcc import find_nvcc
    from core.nnfusion.generated import parse_generated
    from core.nnfusion.launch_check import check_launches

    # the CPU-side launch check, beside what the GPU computed (a launch that cannot start leaves wrong numbers)
    launches = check_launches(source, parse_generated(source), "sm_90", nvcc=find_nvcc(""), workdir=work / "check")
    result["launch_check"] = launches.as_dict()
    for line in launches.reasons() or [launches.error or f"launch check: {launches.summary()}"]:
        print(f"  {line}", flush=True)
    (out / f"nnfusion-{label}.json").write_text(json.dumps(result, indent=1))
    print(f"NNFusion [{label}] {' '.join(flags)}: {timing['median_ms']:.4f} ms median "
          f"(p10 {timing['p10_ms']:.4f}, p90 {timing['p90_ms']:.4f}); max rel err vs float64 {timing['error']:.2e}; "
          f"library calls {result['library_calls']}; compile {compile_s:.1f} s, nvcc {build_s:.0f} s; "
          f"medians of the {runs} run(s): {', '.join(f'{m:.4f}' for m in timing['runs_median_ms'])} ms; "
          f"GPU alone {', '.join(f'{m:.4f}' for m in timing['runs_gpu_only_median_ms'])} ms; host per call "
          f"{', '.join(f'{m:.4f}' for m in timing['runs_host_call_median_ms'])} ms", flush=True)
    for k, picks in enumerate(timing["runs_cudnn_find"], start=1):  # which algorithm each process ran
        if picks:
            print(f"  run {k}: cuDNN's picks " + " ".join(f"{fn.rsplit('_', 1)[-1]}={p['chose']}"
                                                          for fn, p in sorted(picks.items())), flush=True)
    if "tf32_off" in result:
        off = result["tf32_off"]
        print(f"NNFusion [{label}] NVIDIA_TF32_OVERRIDE=0: {off['median_ms']:.4f} ms median; medians of the runs "
              f"{', '.join(f'{m:.4f}' for m in off['runs_median_ms'])} ms; GPU alone "
              f"{', '.join(f'{m:.4f}' for m in off['runs_gpu_only_median_ms'])} ms; max rel err {off['error']:.2e}",
              flush=True)


def part_ops(out: Path, db: Path, model: Path, picks: int = 1, pick_out: Path | None = None) -> None:
    """Each of the model's looked-up ops: the DB's best and efficient rows (their GPU profile, from injection)
    against cuDNN/cuBLAS timed now, the same method; the geometric mean over the convolutions (bench_tune.op_table).
    With `picks` > 1 the library is timed in that many processes and each op counts its fastest
    (bench_tune.fastest_library)."""
    sys.path.insert(0, str(REPO / "bench"))
    from bench_tune import fastest_library, op_table, print_op_rows, with_library_times

    from core.nnfusion.compiler import compiler_prepass
    from core.settings import load_settings
    from core.tuning.network import network_from_model

    if picks <= 1:  # the model as the settings' compiler imports it (after its ONNX Runtime pre-pass)
        prepass = compiler_prepass("", load_settings().nnfusion_path)
        network = with_library_times(network_from_model(model, prepass=prepass), "cuda")
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


def slower_than_library(ops: list[dict], stems: dict[str, str]) -> dict[str, str]:
    """The ops whose row runs slower than the library's fastest pick (an `ops` table, ops.json): kernel name stem
    (the rows' kdb names start with it) -> why. Rows of these ops left out, NNFusion calls cuDNN/cuBLAS for them
    ("never slower than the library"). The stem is the table's own (bench_tune.op_table names it) or, for an older
    table, the one of the model's op with that description (`stems`); an op found in neither is refused, not
    guessed."""
    slower = {}
    for row in ops:
        if row.get("ratio") is None or row["ratio"] <= 1.0:
            continue
        stem = row.get("kernel") or stems.get(row["op"])
        if not stem:
            raise SystemExit(f"ops table: '{row['op']}' names no kernel and is not an op of the model: "
                             "run the ops step again on this model")
        slower[stem] = f"{row['op']}: row {row['best_us']:.1f} us, library {row['library_us']:.1f} us"
    return slower


def model_stems(model: Path) -> dict[str, str]:
    """Each looked-up op of the model: its description -> its rows' kdb name stem."""
    from core.codegen.generate import kernel_name

    return {c.describe(): kernel_name(c).removesuffix("_kernel0") for c, _ in lookup_ops(model)}


def part_dbs(out: Path, tuned: Path, fallback: Path | None, ops_table: Path | None = None,
             model: Path | None = None) -> None:
    """The DB variants the network is compiled with, from the tuned DB (table order matters: NNFusion takes an
    op's first row, and BlockFusion may swap in the row with the smallest time x resource):

        tuned-all    every tuned row (best and efficient), then the fallback's rows for ops tuning left out
        tuned-best   the same without the efficient rows (what BlockFusion gains from them)
        tuned-lib    (with an ops table) tuned-best without the rows of ops the library runs faster, and without
                     fallback rows: NNFusion calls cuDNN/cuBLAS for those ops and for the ops tuning left out
    """
    import json as json_

    from core.db.fastest import profiled_devices
    from core.db.kernel_db import KernelDB
    from core.db.maintenance import apply_plan, fastest_plan
    from core.kernels.kernel_row import distinct_kernels

    with KernelDB.open(tuned) as db:  # table order: the order the compiler picks from
        rows = list(distinct_kernels(db.iter_table_order()))
    extra = []
    if fallback is not None:
        with KernelDB.open(fallback) as db:
            covered = {(r.identifier, r.device_type) for r in rows}
            extra = [r for r in distinct_kernels(db.iter_table_order())
                     if (r.identifier, r.device_type) not in covered]

    def name(row: Any) -> str:
        return json_.loads(row.miscs).get("kdb", {}).get("name", "")

    def best_only(row: Any) -> bool:
        return "_efficient_" not in name(row)

    variants: list[tuple[str, Any, list]] = [("tuned-all", lambda r: True, extra), ("tuned-best", best_only, extra)]
    if ops_table is not None:
        stems = model_stems(model) if model is not None and model.exists() else {}
        slower = slower_than_library(json_.loads(ops_table.read_text()), stems)
        for why in slower.values():
            print(f"  left to the library: {why}")

        def never_slower(row: Any) -> bool:
            return best_only(row) and not any(name(row).startswith(stem + "_") for stem in slower)
        variants.append(("tuned-lib", never_slower, []))
    for label, keep, added in variants:
        path = out / f"{label}.db"
        path.unlink(missing_ok=True)
        with KernelDB.open(path, create=True) as db:
            chosen = [r for r in rows if keep(r)] + added
            for row in chosen:
                db.insert(row)
            fastest = ""
            devices = profiled_devices(db)
            if label != "tuned-all" and len(devices) == 1:  # rows of several runs: the compiler takes the first
                plan = fastest_plan(db, devices.pop())  # `kdb db fastest`'s use case
                apply_plan(db, plan, undo_dir=out / "backups")
                fastest = f"; kept the fastest row of {len(plan.details.choices)} op(s), " \
                          f"{len(plan.details.removals)} rows removed"
        print(f"{path}: {sum(1 for r in rows if keep(r))} tuned rows + {len(added)} fallback rows{fastest}")


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
        for key, name in (("eager", "PyTorch eager (cuDNN)"), ("cuda_graph", "PyTorch CUDA graph (cuDNN)"),
                          ("compile_max_autotune", "PyTorch compile max-autotune")):
            if "median_ms" in p.get(key, {}):  # a mode that failed or was not run has no time
                rows.append((name, p[key]["median_ms"], p[key].get("error", p.get("error"))))
    for f in sorted(out.glob("nnfusion-*.json")):
        n = json.loads(f.read_text())
        rows.append((f"NNFusion, {n['label']} DB", n["median_ms"], n["error"]))
    base = next((ms for name, ms, _ in rows if name == "NNFusion, empty DB"), None)
    print(f"{'contender':34s} {'median ms':>10s} {'vs empty DB':>12s} {'max rel err':>12s}")
    for name, ms, err in rows:  # no empty DB measured into `out` (CONTENDERS left it out): no ratio to it
        ratio = f"{ms / base:11.2f}x" if base else f"{'-':>12s}"
        print(f"{name:34s} {ms:10.4f} {ratio} {err:12.1e}")


NNFUSION_REGION = ("kernel_entry(input, &output): NNFusion's generated host code launching each kernel on stream 0 "
                   "(with the empty DB: each cuDNN call creates, sets and destroys its descriptors inside the call)")


def table(out: Path) -> list[dict]:
    """The end-to-end table of one network: every contender measured into `out`, one timing method. Columns:
    the median run's median, the runs' medians (their spread: one process each), for NNFusion the GPU alone and
    the host's cost of one call, the error, the ratios to the empty DB and to torch.compile. What each timed
    region holds is written under the table and into table.json."""
    rows: list[dict] = []
    pt = out / "pytorch.json"
    if pt.exists():
        p = json.loads(pt.read_text())
        for mode, (key, region) in PYTORCH_MODES.items():
            r = p.get(key)
            if r is None:
                continue
            rows.append({"contender": f"PyTorch {mode}" + (" max-autotune" if mode == "compile" else ""),
                         "median_ms": r.get("median_ms"), "runs_median_ms": r.get("runs_median_ms", []),
                         "error": r.get("error", p.get("error") if mode != "compile" else None),  # older: eager's
                         "timed_region": r.get("timed_region", region),
                         "failed": r.get("failed", [])})
    for f in sorted(out.glob("nnfusion-*.json")):
        n = json.loads(f.read_text())
        for suffix, r in (("", n), (", TF32 off", n.get("tf32_off"))):
            if r is None:
                continue
            rows.append({"contender": f"NNFusion, {n['label']} DB{suffix}", "median_ms": r["median_ms"],
                         "runs_median_ms": r.get("runs_median_ms", [r["median_ms"]]),
                         "gpu_only_ms": r.get("gpu_only_median_ms"), "host_call_ms": r.get("host_call_median_ms"),
                         "error": r["error"], "library_calls": n.get("library_calls"),
                         "timed_region": NNFUSION_REGION + (" (NVIDIA_TF32_OVERRIDE=0)" if suffix else "")})
    empty = next((r["median_ms"] for r in rows if r["contender"] == "NNFusion, empty DB"), None)
    compiled = next((r["median_ms"] for r in rows if r["contender"] == "PyTorch compile max-autotune"), None)

    def cell(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    print(f"{'contender':40s} {'median ms':>9s} {'runs min-max':>15s} {'GPU alone':>9s} {'host/call':>9s} "
          f"{'max rel err':>11s} {'/empty':>6s} {'/compile':>8s}")
    for r in rows:
        runs = r["runs_median_ms"]
        spread = f"{min(runs):.4f}-{max(runs):.4f}" if runs else "-"
        ms = r["median_ms"]
        r["vs_empty"] = ms / empty if ms and empty else None
        r["vs_compile"] = ms / compiled if ms and compiled else None
        print(f"{r['contender']:40s} {cell(ms, '9.4f'):>9s} {spread:>15s} {cell(r.get('gpu_only_ms'), '9.4f'):>9s} "
              f"{cell(r.get('host_call_ms'), '9.4f'):>9s} {cell(r['error'], '11.1e'):>11s} "
              f"{cell(r['vs_empty'], '5.2f'):>6s} {cell(r['vs_compile'], '7.2f'):>8s}"
              + (f"  FAILED: {r['failed'][-1][:80]}" if r.get("failed") and ms is None else ""))
    print("timed regions:")
    for region in dict.fromkeys(r["timed_region"] for r in rows):
        print(f"  {', '.join(r['contender'] for r in rows if r['timed_region'] == region)}: {region}")
    (out / "table.json").write_text(json.dumps(rows, indent=1))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["export", "pytorch", "pytorch-one", "tune", "dbs", "nnfusion", "ops", "summary",
                                     "table", "fallback"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--net", choices=NETS, default="resnet18", help="the network (default resnet18)")
    ap.add_argument("--db", type=Path)
    ap.add_argument("--model", type=Path, help="default: OUT/NET.onnx")
    ap.add_argument("--trials", type=int, default=448, help="tune: trials for the whole network")
    ap.add_argument("--floor", type=int, default=16, help="tune: at least this many trials per op")
    ap.add_argument("--nnfusion", type=Path, default=Path(shutil.which("nnfusion") or "nnfusion"))
    ap.add_argument("--label", default="tuned")
    ap.add_argument("--fallback", type=Path, help="dbs: rows for the ops the tuned DB lacks (kdb's default kernels)")
    ap.add_argument("--ops-table", type=Path, help="dbs: an `ops` step's ops.json; adds tuned-lib.db, the tuned rows "
                                                   "of the ops whose row beats the library")
    ap.add_argument("--flag", action="append", default=[], help="nnfusion: an extra compiler flag (repeatable)")
    ap.add_argument("--trace-steps", action="store_true",
                    help="nnfusion: synchronise and name each step of the first call (finds the step that hangs)")
    ap.add_argument("--picks", type=int, default=1,
                    help="ops: time the library in this many processes, each op counting its fastest")
    ap.add_argument("--pick-out", type=Path, help=argparse.SUPPRESS)  # ops, pytorch-one: one process's result
    ap.add_argument("--runs", type=int, default=1,
                    help="nnfusion, pytorch: time each contender in this many processes; the median run counts")
    ap.add_argument("--tf32-off-runs", type=int, default=0,
                    help="nnfusion: this many more runs of the same binary with NVIDIA_TF32_OVERRIDE=0 (cuDNN's and "
                         "cuBLAS's TF32 off), where the network calls the library")
    ap.add_argument("--modes", default="eager,graph,compile",
                    help=f"pytorch: comma-separated, of {', '.join(PYTORCH_MODES)}")
    ap.add_argument("--timeout", type=float, default=420.0,
                    help="pytorch: seconds one process may take (torch.compile's first one autotunes)")
    args = ap.parse_args()
    if args.runs < 1 or args.tf32_off_runs < 0 or args.picks < 1:
        ap.error("--runs and --picks must be at least 1, --tf32-off-runs at least 0")
    if args.part in ("dbs", "nnfusion", "ops", "tune") and args.db is None:
        ap.error(f"{args.part} needs --db")
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or args.out / f"{args.net}.onnx"
    if args.part in ("nnfusion", "ops", "tune") and not model.exists():
        ap.error(f"{model}: no such model (run the export part first, with the same --out and --net)")
    if args.part == "export":
        part_export(args.out, args.net)
    elif args.part == "pytorch":
        part_pytorch(args.out, args.net, [m for m in args.modes.split(",") if m], args.runs, args.timeout)
    elif args.part == "pytorch-one":
        if args.pick_out is None:
            ap.error("pytorch-one needs --pick-out")
        args.pick_out.write_text(json.dumps(pytorch_one(args.out, args.net, [m for m in args.modes.split(",") if m])))
    elif args.part == "tune":
        part_tune(args.out, args.db, model, args.trials, args.floor)
    elif args.part == "dbs":
        part_dbs(args.out, args.db, args.fallback, args.ops_table, model)
    elif args.part == "nnfusion":
        part_nnfusion(args.out, args.db, model, args.nnfusion, args.label, args.flag, args.trace_steps, args.runs,
                      args.tf32_off_runs)
    elif args.part == "ops":
        part_ops(args.out, args.db, model, args.picks, args.pick_out)
    elif args.part == "fallback":
        part_fallback(args.out, args.db or args.out / "kdb.db")
    elif args.part == "table":
        table(args.out)
    else:
        summary(args.out)


if __name__ == "__main__":
    main()
