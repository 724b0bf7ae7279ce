"""The untuned default schedule against the library, op kind by op kind (issue 39: "never absurd", within 3x).

    python3 bench/bench_default_schedules.py build DIR     # here (TVM, nvcc): DIR/defaults.so and DIR/cases.json
    python3 bench/bench_default_schedules.py time DIR      # on a GPU (PyTorch): prints the table

`build` writes each case's kernel as `kdb codegen` generates it ("now"), and as the default schedule was before few
outputs with a long reduction were shared among a block's threads ("thread per output"), with a C launcher each, into
one shared library (nvcc, sm_90, static cudart). `time` runs them and PyTorch's call on the same data (fp32, TF32
off): cuBLAS for the Dots, cuDNN for the convolutions, torch.softmax for the softmaxes, and for the pools PyTorch's
own pooling kernel and its mean/amax reduction, the faster of the two taken (NNFusion calls cuDNN's pooling, which
this does not run). Each is captured in a CUDA graph of 20 launches; the figure is the median of 15 replays divided
by 20. Errors are against PyTorch's result in float64.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONV = "cudnn_convolution_op_float"
CASES = {
    "avgpool_global_32x112x112": "cudnn_avgpool_op_float|i+1_32_112_112|o+1_32_1_1|win+112_112|ws+1_1|pb+0_0|pa+0_0",
    "avgpool_global_2048x7x7": "cudnn_avgpool_op_float|i+1_2048_7_7|o+1_2048_1_1|win+7_7|ws+1_1|pb+0_0|pa+0_0",
    "maxpool_global_64x32x32": "cudnn_maxpool_op_float|i+1_64_32_32|o+1_64_1_1|win+32_32|ws+1_1|pb+0_0|pa+0_0",
    "gemv_1x2048_by_1000x2048T": "cublas_dot_op_float|a+1_2048|b+1000_2048|o+1_1000|ta+0|tb+1",
    "gemv_1x768_by_768x3072": "cublas_dot_op_float|a+1_768|b+768_3072|o+1_3072|ta+0|tb+0",
    "gemv_1x3072_by_3072x768": "cublas_dot_op_float|a+1_3072|b+3072_768|o+1_768|ta+0|tb+0",
    "gemv_1x256_by_256x768": "cublas_dot_op_float|a+1_256|b+256_768|o+1_768|ta+0|tb+0",
    "conv1x1_512to128_7x7": f"{CONV}|i+1_512_7_7|w+128_512_1_1|o+1_128_7_7|ws+1_1|wd+1_1|p+0_0",
    "conv1x1_1024to256_14x14": f"{CONV}|i+1_1024_14_14|w+256_1024_1_1|o+1_256_14_14|ws+1_1|wd+1_1|p+0_0",
    "conv3x3_512to512_7x7": f"{CONV}|i+1_512_7_7|w+512_512_3_3|o+1_512_7_7|ws+1_1|wd+1_1|p+1_1",
    # a block of threads per row (schedule._block_per_row), against torch.softmax (NNFusion's empty DB runs ONNX
    # Runtime's warp softmax for rows up to 1024, which this does not run)
    "softmax_bert_12x128x128": "cudnn_softmax_op_float|i+1_12_128_128|o+1_12_128_128",
    "softmax_vit_6x197x197": "cudnn_softmax_op_float|i+1_6_197_197|o+1_6_197_197",
    "softmax_classifier_1x1000": "cudnn_softmax_op_float|i+1_1000|o+1_1000",
}
VARIANTS = {"now": None, "thread_per_output": 0}  # CROSS_THREAD_MAX_OUTPUTS for each (None: as shipped)
REPS, ROUNDS = 20, 15


def build(out: Path) -> None:
    import core.codegen.schedule as schedule
    from core.codegen.generate import generate
    from core.opconfigs.opconfig import parse_line

    out.mkdir(parents=True, exist_ok=True)
    shipped = schedule.CROSS_THREAD_MAX_OUTPUTS
    source, cases = ["#include <cuda_runtime.h>\n"], {}
    for variant, limit in VARIANTS.items():
        schedule.CROSS_THREAD_MAX_OUTPUTS = shipped if limit is None else limit
        for name, line in CASES.items():
            item = generate(parse_line(line, name), "sm_90", check=False).item
            assert item is not None, f"{name}: no kernel"
            fn = f"{name}_{variant}"
            code = item["code"].replace(item["tvm_func_name"], f"{fn}_k")
            params = re.findall(r"float\* __restrict__ (\w+)", code.split("{")[0])
            grid, block = item["gridDim"], item["blockDim"]
            source += [code, f'extern "C" void {fn}({", ".join(f"float* {p}" for p in params)}, cudaStream_t s) '
                       f"{{ {fn}_k<<<dim3({', '.join(map(str, grid))}), dim3({', '.join(map(str, block))}), 0, s>>>"
                       f"({', '.join(params)}); }}\n"]
            cases.setdefault(name, {"line": line})[variant] = {"grid": grid, "block": block}
    schedule.CROSS_THREAD_MAX_OUTPUTS = shipped
    (out / "defaults.cu").write_text("\n".join(source), encoding="utf-8")
    (out / "cases.json").write_text(json.dumps(cases, indent=1), encoding="utf-8")
    subprocess.run(["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", "-cudart", "static",
                    "-gencode", "arch=compute_90,code=sm_90", "-o", str(out / "defaults.so"), str(out / "defaults.cu")],
                   check=True)
    print(f"{out / 'defaults.so'}: {len(CASES)} cases x {len(VARIANTS)} variants")


def _dims(line: str, key: str) -> tuple[int, ...]:
    return tuple(int(d) for f in line.split("|") if f.startswith(key) for d in f[len(key):].split("_"))


def time_all(out: Path) -> None:
    import ctypes

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    lib = ctypes.CDLL(str(out / "defaults.so"))
    cases = json.loads((out / "cases.json").read_text(encoding="utf-8"))

    def graph_us(fn) -> float:  # type: ignore[no-untyped-def]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(REPS):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(ROUNDS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1000 / REPS)
        return statistics.median(times)

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, fp32 with TF32 off; us per launch, CUDA graph "
          f"of {REPS}, median of {ROUNDS}; ratios against the faster library way")
    print(f"{'case':27} {'library':>16} {'us':>8} {'2nd lib us':>10} {'now us':>8} {'now/lib':>8} "
          f"{'per-thread us':>13} {'/lib':>7} {'err now':>8}")
    ratios = []
    for name, case in cases.items():
        line = case["line"]
        torch.manual_seed(0)
        inputs, label, library, second = _library_call(line)
        reference = library().double()
        lib_us = graph_us(library)
        second_us = graph_us(second) if second else None
        best = min(lib_us, second_us or lib_us)  # the faster of PyTorch's two ways for a pool
        row, err = [], 0.0
        for variant in VARIANTS:
            result = torch.empty(_dims(line, "o+"), device="cuda")
            kernel = getattr(lib, f"{name}_{variant}")
            pointers = [ctypes.c_void_p(t.data_ptr()) for t in (*inputs, result)]
            run = _launcher(kernel, pointers)
            run()
            torch.cuda.synchronize()
            error = ((result.double() - reference).abs().max() / reference.abs().max()).item()
            assert error < 1e-4, f"{name} ({variant}): wrong, relative error {error:.1e}"
            err = error if variant == "now" else err
            row.append(graph_us(run))
        ratios.append(row[0] / best)
        second_text = f"{second_us:10.2f}" if second_us else f"{'':10}"
        print(f"{name:27} {label:>16} {lib_us:8.2f} {second_text} {row[0]:8.2f} {row[0] / best:8.2f} "
              f"{row[1]:13.2f} {row[1] / best:7.2f} {err:8.1e}")
    print(f"now/library: worst {max(ratios):.2f}x, geomean "
          f"{statistics.geometric_mean(ratios):.2f}x over {len(ratios)} ops")


def _library_call(line: str):  # type: ignore[no-untyped-def]
    """The op's inputs, the library's name, PyTorch's call of it and (pools) a second PyTorch way."""
    import torch
    import torch.nn.functional as F

    if "pool" in line:
        shape = _dims(line, "i+")
        x = torch.randn(shape, device="cuda")
        if "avgpool" in line:
            return [x], "torch avg_pool2d", lambda: F.avg_pool2d(x, shape[2:]), lambda: x.mean((2, 3))
        return [x], "torch max_pool2d", lambda: F.max_pool2d(x, shape[2:]), lambda: x.amax((2, 3))
    if "softmax" in line:
        x = torch.randn(_dims(line, "i+"), device="cuda")
        return [x], "torch softmax", lambda: torch.softmax(x, -1), None
    if "dot" in line:
        a = torch.randn(_dims(line, "a+"), device="cuda")
        b = torch.randn(_dims(line, "b+"), device="cuda")
        return [a, b], "cuBLAS", (lambda: a @ b.t()) if "tb+1" in line else (lambda: a @ b), None
    x = torch.randn(_dims(line, "i+"), device="cuda")
    w = torch.randn(_dims(line, "w+"), device="cuda")
    pad = _dims(line, "p+")
    return [x, w], "cuDNN", lambda: F.conv2d(x, w, padding=pad), None


def _launcher(kernel, pointers):  # type: ignore[no-untyped-def]
    """The kernel's launch on the stream current when it is called (a graph's capture stream while capturing)."""
    import ctypes

    import torch

    return lambda: kernel(*pointers, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["build", "time"])
    parser.add_argument("dir", type=Path)
    args = parser.parse_args()
    build(args.dir) if args.step == "build" else time_all(args.dir)


if __name__ == "__main__":
    main()
