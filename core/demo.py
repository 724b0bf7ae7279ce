"""The demo kernel DB `make run` opens, made by the console itself and cached in the state dir.

With TVM installed (the normal case): the op configs of a small built-in network (TINY_NETWORK, a
ResNet-style CNN) are code-generated and injected, exactly the path a user takes for a new model.
Without TVM: hand-written kernels of the same kinds (demo_kernels) stand in. Either way one extra item is
deliberately one the compiler could not use (a barrier inside a while loop), so the Failures view has
something to show.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from core.db.state import StateDB, state_dir
from core.inject.pipeline import InjectOptions, InjectReport
from core.inject.session import open_injector


def _elementwise(op: str, shape: list[int], expr: str, inputs: int) -> dict[str, Any]:
    n = math.prod(shape)
    params = ", ".join([f"float* __restrict__ input{i}" for i in range(inputs)] + ["float* __restrict__ output0"])
    code = (f'extern "C" __global__ void __launch_bounds__(256) demo_{op.lower()}_kernel0({params}) {{\n'
            f"  int i = ((int)blockIdx.x) * 256 + ((int)threadIdx.x);\n"
            f"  if (i < {n}) {{\n    output0[i] = {expr};\n  }}\n}}\n")
    p: dict[str, Any] = {"output_shape": shape}
    if inputs == 1:
        p["input_shape"] = shape
    else:
        p["input_shapes"] = [shape] * inputs
    return {"tvm_func_name": f"demo_{op.lower()}_kernel0", "op_type": op, "parameters": p, "code": code,
            "gridDim": [math.ceil(n / 256), 1, 1], "blockDim": [256, 1, 1]}


def _dot(m: int, k: int, n: int, tile: int = 16) -> dict[str, Any]:
    code = (
        f'extern "C" __global__ void demo_dot_m{m}_k{k}_n{n}_kernel0(float* __restrict__ A, '
        "float* __restrict__ B, float* __restrict__ C) {\n"
        f"  __shared__ float A_shared[{tile}][{tile}];\n"
        f"  __shared__ float B_shared[{tile * tile}];\n"
        f"  int row = ((int)blockIdx.y) * {tile} + ((int)threadIdx.y);\n"
        f"  int col = ((int)blockIdx.x) * {tile} + ((int)threadIdx.x);\n"
        "  float acc = 0.000000e+00f;\n"
        f"  for (int k_outer = 0; k_outer < {k // tile}; ++k_outer) {{\n"
        f"    A_shared[threadIdx.y][threadIdx.x] = A[row * {k} + k_outer * {tile} + ((int)threadIdx.x)];\n"
        f"    B_shared[((int)threadIdx.y) * {tile} + ((int)threadIdx.x)] = "
        f"B[(k_outer * {tile} + ((int)threadIdx.y)) * {n} + col];\n"
        "    __syncthreads();\n"
        f"    for (int k_inner = 0; k_inner < {tile}; ++k_inner) {{\n"
        f"      acc = acc + A_shared[threadIdx.y][k_inner] * B_shared[k_inner * {tile} + ((int)threadIdx.x)];\n"
        "    }\n"
        "    __syncthreads();\n"
        "  }\n"
        f"  C[row * {n} + col] = acc;\n"
        "}\n"
    )
    return {"tvm_func_name": f"demo_dot_m{m}_k{k}_n{n}_kernel0", "op_type": "Dot",
            "parameters": {"arg0_shape": [m, k], "arg1_shape": [k, n], "out_shape": [m, n],
                           "transpose_A": False, "transpose_B": False},
            "code": code, "gridDim": [n // tile, m // tile, 1], "blockDim": [tile, tile, 1]}


def _conv(op: str, c: int, hw: int, k: int, r: int, pad: int) -> dict[str, Any]:
    out_hw = hw + 2 * pad - r + 1
    relu = op == "Fused_Convolution_Relu"
    total = k * out_hw * out_hw
    name = f"demo_{'conv_relu' if relu else 'conv'}_c{c}_hw{hw}_k{k}_r{r}_kernel0"
    value = "(acc > 0.000000e+00f ? acc : 0.000000e+00f)" if relu else "acc"
    code = (
        f'extern "C" __global__ void {name}(float* __restrict__ input0, float* __restrict__ input1, '
        "float* __restrict__ compute) {\n"
        f"  int idx = ((int)blockIdx.x) * 128 + ((int)threadIdx.x);\n"
        f"  if (idx < {total}) {{\n"
        f"    int ff = idx / {out_hw * out_hw};\n"
        f"    int yy = (idx / {out_hw}) % {out_hw};\n"
        f"    int xx = idx % {out_hw};\n"
        "    float acc = 0.000000e+00f;\n"
        f"    for (int rc = 0; rc < {c}; ++rc) {{\n"
        f"      for (int ry = 0; ry < {r}; ++ry) {{\n"
        f"        for (int rx = 0; rx < {r}; ++rx) {{\n"
        f"          int iy = yy + ry - {pad};\n"
        f"          int ix = xx + rx - {pad};\n"
        f"          if (0 <= iy && iy < {hw} && 0 <= ix && ix < {hw}) {{\n"
        f"            acc = acc + input0[(rc * {hw} + iy) * {hw} + ix]"
        f" * input1[((ff * {c} + rc) * {r} + ry) * {r} + rx];\n"
        "          }\n        }\n      }\n    }\n"
        f"    compute[idx] = {value};\n"
        "  }\n}\n"
    )
    return {"tvm_func_name": name, "op_type": op,
            "parameters": {"input_shape": [1, c, hw, hw], "filter_shape": [k, c, r, r],
                           "output_shape": [1, k, out_hw, out_hw], "window_movement_strides": [1, 1],
                           "window_dilation_strides": [1, 1], "padding_below_diff": [pad, pad]},
            "code": code, "gridDim": [math.ceil(total / 128), 1, 1], "blockDim": [128, 1, 1]}


def _pool(op: str, c: int, hw: int, window: int, stride: int, pad: int) -> dict[str, Any]:
    out_hw = (hw + 2 * pad - window) // stride + 1
    total = c * out_hw * out_hw
    init = "-3.402823e+38f" if op == "MaxPool" else "0.000000e+00f"
    update = "v = max(v, x);" if op == "MaxPool" else "v = v + x;"
    result = "v" if op == "MaxPool" else f"v * {1.0 / (window * window):.9e}f"
    name = f"demo_{op.lower()}_c{c}_hw{hw}_w{window}_s{stride}_kernel0"
    code = (
        f'extern "C" __global__ void {name}(float* __restrict__ input0, float* __restrict__ output0) {{\n'
        f"  int idx = ((int)blockIdx.x) * 256 + ((int)threadIdx.x);\n"
        f"  if (idx < {total}) {{\n"
        f"    int cc = idx / {out_hw * out_hw};\n"
        f"    int oy = (idx / {out_hw}) % {out_hw};\n"
        f"    int ox = idx % {out_hw};\n"
        f"    float v = {init};\n"
        f"    for (int wy = 0; wy < {window}; ++wy) {{\n"
        f"      for (int wx = 0; wx < {window}; ++wx) {{\n"
        f"        int iy = oy * {stride} + wy - {pad};\n"
        f"        int ix = ox * {stride} + wx - {pad};\n"
        f"        float x = (0 <= iy && iy < {hw} && 0 <= ix && ix < {hw}) ? input0[(cc * {hw} + iy) * {hw} + ix] : "
        f"{'-3.402823e+38f' if op == 'MaxPool' else '0.000000e+00f'};\n"
        f"        {update}\n"
        "      }\n    }\n"
        f"    output0[idx] = {result};\n"
        "  }\n}\n"
    )
    return {"tvm_func_name": name, "op_type": op,
            "parameters": {"input_shape": [1, c, hw, hw], "output_shape": [1, c, out_hw, out_hw],
                           "window_shape": [window, window], "window_stride": [stride, stride],
                           "padding_below": [pad, pad], "padding_above": [pad, pad]},
            "code": code, "gridDim": [math.ceil(total / 256), 1, 1], "blockDim": [256, 1, 1]}


def _unprovable() -> dict[str, Any]:
    item = _elementwise("Sigmoid", [1, 1024], "1.000000e+00f / (1.000000e+00f + __expf(-input0[i]))", 1)
    item["tvm_func_name"] = "demo_sigmoid_spin_kernel0"
    item["code"] = item["code"].replace("demo_sigmoid_kernel0", "demo_sigmoid_spin_kernel0").replace(
        "  if (i < 1024) {", "  while (input0[0] < 0.000000e+00f) {\n    __syncthreads();\n  }\n  if (i < 1024) {")
    return item


def demo_kernels() -> list[dict[str, Any]]:
    shape = [1, 64, 56, 56]
    return [
        _elementwise("Relu", shape, "max(input0[i], 0.000000e+00f)", 1),
        _elementwise("Add", shape, "input0[i] + input1[i]", 2),
        _elementwise("Tanh", [1, 4096], "tanhf(input0[i])", 1),
        _dot(64, 256, 128),
        _dot(128, 512, 256),
        _conv("Convolution", 16, 32, 32, 3, 1),
        _conv("Fused_Convolution_Relu", 16, 32, 32, 3, 1),
        _conv("Convolution", 32, 16, 64, 1, 0),
        _pool("MaxPool", 64, 56, 2, 2, 0),
        _pool("AvgPool", 64, 28, 3, 1, 1),
        _unprovable(),
    ]


# A tiny ResNet-style CNN on 32x32 images, as op configs (the line format of core.opconfigs.opconfig).
TINY_NETWORK = """\
cudnn_convolution_op_float|i+1_3_32_32|w+16_3_3_3|o+1_16_32_32|ws+1_1|wd+1_1|p+1_1|fuse+relu
cudnn_maxpool_op_float|i+1_16_32_32|o+1_16_16_16|win+2_2|ws+2_2|pb+0_0|pa+0_0
cudnn_convolution_op_float|i+1_16_16_16|w+16_16_3_3|o+1_16_16_16|ws+1_1|wd+1_1|p+1_1|fuse+relu
cudnn_convolution_op_float|i+1_16_16_16|w+16_16_3_3|o+1_16_16_16|ws+1_1|wd+1_1|p+1_1|fuse+add_relu
cudnn_convolution_op_float|i+1_16_16_16|w+32_16_3_3|o+1_32_8_8|ws+2_2|wd+1_1|p+1_1|fuse+relu
cudnn_avgpool_op_float|i+1_32_8_8|o+1_32_1_1|win+8_8|ws+8_8|pb+0_0|pa+0_0
cublas_dot_op_float|a+1_32|b+32_10|o+1_10|ta+0|tb+0
elementwise_relu_op_float|i+1_16_32_32|o+1_16_32_32
"""


def tiny_network_kernels(arch: str) -> list[dict[str, Any]]:
    """Kernel JSON for TINY_NETWORK, generated with TVM (default schedules, checked against numpy)."""
    from core.codegen.batch import generate_all
    from core.opconfigs.opconfig import parse_lines

    parsed = parse_lines(TINY_NETWORK, "tiny-network")
    report = generate_all(parsed.configs, arch)
    if report.failed:
        bad = report.failed[0]
        raise RuntimeError(f"the built-in network failed to generate: {bad.config.describe()}: {bad.error}")
    return report.items


def demo_db_path() -> Path:
    return state_dir() / "demo" / "kernel_cache.db"


def demo_opconfigs_path() -> Path:
    """TINY_NETWORK as an op-config file beside the demo DB (written when missing), for the console to list."""
    path = demo_db_path().with_name("tiny_network.txt")
    if not path.is_file() or path.read_text(encoding="utf-8") != TINY_NETWORK:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(TINY_NETWORK, encoding="utf-8")
        tmp.replace(path)
    return path


def build_demo_db(*, compile_check: bool, archs: tuple[str, ...] = ("sm_90",), nvcc: str = "",
                  workers: int = 1) -> tuple[Path, InjectReport | None]:
    """The demo DB, built on first use (kernels written to the state dir, then injected)."""
    path = demo_db_path()
    if path.exists():
        return path, None
    src = path.parent / "demo_kernels.json"
    src.parent.mkdir(parents=True, exist_ok=True)
    try:
        items = [*tiny_network_kernels(archs[0]), _unprovable()]
    except ImportError:  # no TVM here: hand-written kernels of the same kinds
        items = demo_kernels()
    src.write_text(json.dumps(items, indent=1), encoding="utf-8")
    tmp = path.with_name("building.db")
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        leftover.unlink(missing_ok=True)
    options = InjectOptions(archs=archs, compile=compile_check, nvcc=nvcc, workers=workers)
    with open_injector(tmp, options) as injector:
        report = injector.run([src], kind="demo")
    tmp.replace(path)  # failures recorded against the final path below
    _retarget_failures(tmp, path)
    return path, report


def _retarget_failures(old: Path, new: Path) -> None:
    state = StateDB()
    try:
        state.retarget_failures(old, new)
    finally:
        state.close()
