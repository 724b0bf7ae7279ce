"""The row a kernel becomes: its Key tells every kernel apart, and its block form compiles like its own form."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.cuda.barriers import count_barriers
from core.cuda.nvcc import compile_source, translation_unit
from core.cuda.source import parse_kernel
from core.demo import _dot, demo_kernels
from core.kernels.kernel_json import validate_item
from core.kernels.kernel_row import KernelRow, build_row, kernel_key, shared_bytes

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else "")


def row_of(item: dict) -> KernelRow:
    spec = validate_item(item)
    src = parse_kernel(spec.code)
    return build_row(spec, src, count_barriers(src, spec.block, spec.grid))


def test_the_key_changes_with_each_of_its_parts():
    parts = ("Relu2,3;2,3floatfloat", (4, 1, 1), (256, 1, 1), "output0[0] = 1.f;")
    key = kernel_key(*parts)
    others = [("Relu2,3;2,3halfhalf", *parts[1:]), (parts[0], (2, 2, 1), *parts[2:]),
              (*parts[:2], (128, 2, 1), parts[3]), (*parts[:3], "output0[0] = 2.f;")]
    assert len({key, *(kernel_key(*p) for p in others)}) == 5
    assert kernel_key(*parts) == key  # and it is a function of them alone


def test_kernels_that_differ_only_in_block_dims_are_two_rows():
    """The same body launched as 256x1x1 or 128x2x1 threads computes different things: both rows are kept."""
    item = demo_kernels()[0]
    one, other = row_of(item), row_of({**item, "blockDim": [128, 2, 1]})
    assert one.identifier == other.identifier and json.loads(one.function)["function_body"] == json.loads(
        other.function)["function_body"]
    assert one.key != other.key
    assert row_of({**item, "gridDim": [item["gridDim"][0] * 2, 1, 1]}).key not in (one.key, other.key)


SCALAR_SHARED = {
    "tvm_func_name": "demo_scalar_shared_kernel0", "op_type": "Relu",
    "parameters": {"input_shape": [1, 256], "output_shape": [1, 256]},
    "code": ('extern "C" __global__ void demo_scalar_shared_kernel0(float* __restrict__ input0, '
             "float* __restrict__ output0) {\n"
             "  __shared__ float top;\n"
             "  if (threadIdx.x == 0) { top = input0[0]; }\n"
             "  __syncthreads();\n"
             "  output0[threadIdx.x] = max(input0[threadIdx.x], top);\n"
             "}\n"),
    "gridDim": [1, 1, 1], "blockDim": [256, 1, 1]}


HOISTED = pytest.mark.parametrize("item", [_dot(64, 256, 128), SCALAR_SHARED],
                                  ids=["2-D shared arrays", "a shared scalar"])


@HOISTED
def test_the_block_body_reaches_hoisted_shared_memory_through_its_aliases(item: dict):
    """NNFusion declares shared_memory's entries flat, before block_function_body: a 2-D array or a scalar is
    reached through an alias at the top of that body (the form BlockFusion puts into its fused kernels)."""
    src = parse_kernel(item["code"])
    hoisted = [d for d in src.shared if d.alias]
    assert hoisted
    function = json.loads(row_of(item).function)
    assert function["shared_memory"]["symbol"] == [d.symbol for d in src.shared]
    body = function["block_function_body"]
    for decl in hoisted:
        assert decl.alias in body and f"__shared__ {decl.dtype} {decl.name}" not in body


@HOISTED
@pytest.mark.skipif(not NVCC, reason="needs nvcc")
def test_the_block_form_compiles(item: dict, tmp_path: Path):
    result = compile_source(translation_unit(json.loads(row_of(item).function)), "sm_80", nvcc=NVCC,
                            workdir=tmp_path)
    assert result.ok, result.error


def test_shared_bytes_weigh_each_dtype():
    """The Kernels view's "smem B": half is 2 bytes, double 8; an unknown type gives no number, not a guess."""
    shared = {"symbol": ["a", "b", "c", "d"], "dtype": ["half", "float", "double", "half2"], "size": [8, 2, 1, 3]}
    assert shared_bytes({"shared_memory": shared}) == 8 * 2 + 2 * 4 + 1 * 8 + 3 * 4
    assert shared_bytes({"shared_memory": {**shared, "dtype": ["half", "float", "double", "bfloat16"]}}) is None
    assert shared_bytes({}) == 0


ALIGNED_SHARED = {  # each thread reads four neighbouring floats of a 64-byte aligned array, as TVM's kernels do
    "tvm_func_name": "demo_aligned_shared_kernel0", "op_type": "Relu",
    "parameters": {"input_shape": [1, 256], "output_shape": [1, 256]},
    "code": ('extern "C" __global__ void __launch_bounds__(64) demo_aligned_shared_kernel0(float* __restrict__ input0, '
             "float* __restrict__ output0) {\n"
             "  __shared__ alignas(64) float staged_shared[256];\n"
             "  for (int i = 0; i < 4; ++i) { staged_shared[threadIdx.x * 4 + i] = input0[threadIdx.x * 4 + i]; }\n"
             "  __syncthreads();\n"
             "  float a = staged_shared[threadIdx.x * 4], b = staged_shared[threadIdx.x * 4 + 1];\n"
             "  float c = staged_shared[threadIdx.x * 4 + 2], d = staged_shared[threadIdx.x * 4 + 3];\n"
             "  output0[threadIdx.x * 4] = max(a, 0.f); output0[threadIdx.x * 4 + 1] = max(b, 0.f);\n"
             "  output0[threadIdx.x * 4 + 2] = max(c, 0.f); output0[threadIdx.x * 4 + 3] = max(d, 0.f);\n"
             "}\n"),
    "gridDim": [1, 1, 1], "blockDim": [64, 1, 1]}


def test_a_shared_array_that_asks_for_an_alignment_is_declared_with_it():
    """NNFusion writes the symbol verbatim into `__shared__ float <symbol>[N];`: the alignment goes there."""
    sm = json.loads(row_of(ALIGNED_SHARED).function)["shared_memory"]
    assert sm["symbol"] == ["__align__(64) staged_shared"] and sm["dtype"] == ["float"]
    plain = json.loads(row_of(SCALAR_SHARED).function)["shared_memory"]
    assert plain["symbol"] == ["top_kdb_flat"]  # nothing asked, nothing added


@pytest.mark.skipif(not NVCC, reason="needs nvcc")
def test_the_row_keeps_tvms_128_bit_shared_loads(tmp_path: Path):
    """With the array declared 4-byte aligned (a plain float array) nvcc reads the four floats one by one; the
    row's standalone form, as NNFusion compiles it, must read them in one 128-bit load as TVM's kernel does."""
    import subprocess

    from core.cuda.nvcc import standalone_source

    for name, source in (("tvm", ALIGNED_SHARED["code"]),
                         ("row", standalone_source(json.loads(row_of(ALIGNED_SHARED).function)))):
        (tmp_path / f"{name}.cu").write_text(source)
        subprocess.run([NVCC, "-arch=sm_80", "-ptx", "-O3", "-o", str(tmp_path / f"{name}.ptx"),
                        str(tmp_path / f"{name}.cu")], check=True, capture_output=True, timeout=120)
        assert "ld.shared.v4.f32" in (tmp_path / f"{name}.ptx").read_text(), name
