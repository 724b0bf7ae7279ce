"""Which column decides whether NNFusion uses a row (issue 39, "every op NNFusion asks the DB for"), proved with the
real compiler.

NNFusion fetches every node's identifier, BatchMatMul and Softmax included (`Trying to fetch kernel
BatchMatMul6,...`), and its FetchBasedSelector (engine/pass/graph/kernel_selection.cpp) takes any External row of
that identifier with the BlockCudaEmitter tag. Only engine/cache/manager.cpp's fetch_all stands between: it drops
the fetch when a row's OpType column is not in its SupportOpList (the element-op map, Dot, Convolution, AvgPool,
MaxPool, the two fused convolutions, Matched_Pattern), saying "Unsupported op_type". The OpType column is read for
nothing else: a BatchMatMul row whose OpType says Dot is used.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from shared_data import shared_path

pytest.importorskip("onnx")

from onnx_models import GraphBuilder, write

from core.db.kernel_db import KernelDB

COMPILER = Path(os.environ.get("KDB_TEST_NNFUSION", shared_path("nnfusion/bin/nnfusion")))
pytestmark = pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                                "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone")
IDENTIFIER = "BatchMatMul2,8,16;2,16,8;2,8,8floatfloatfloat"
MARK = "kdb-probe-batch-matmul"
# One thread per output element: out[b, i, j] = sum_k a[b, i, k] * b[b, k, j] (2 x 8 x 8 = 128 outputs).
BODY = f"""
  int t = (int)threadIdx.x;
  int b = t / 64, i = (t / 8) % 8, j = t % 8;
  float acc = 0.0f;
  for (int k = 0; k < 16; ++k) {{ acc = acc + input0[(b * 8 + i) * 16 + k] * input1[(b * 16 + k) * 8 + j]; }}
  output0[t] = acc;  /* {MARK} */
"""


def batched_matmul(path: Path) -> Path:
    """x[2, 8, 16] @ w[2, 16, 8]: NNFusion's importer makes it a BatchMatMul (a right operand of rank 3)."""
    g = GraphBuilder({"x": [2, 8, 16]})
    return write(g.model(g.node("MatMul", ["x", g.weight("w", [2, 16, 8])], "mm"), "bmm"), path)


def probe_db(path: Path, op_type: str) -> Path:
    KernelDB.open(path, create=True).close()
    function = {"function_signature": 'extern "C" __launch_bounds__(128) __global__ void (float* __restrict__ input0, '
                                      'float* __restrict__ input1, float* __restrict__ output0)',
                "function_body": BODY, "block_function_body": BODY, "grid_dim": [1, 1, 1], "block_dim": [128, 1, 1],
                "shared_memory": {"symbol": [], "dtype": [], "size": []}, "num_syncthreads": 0}
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO KernelCache VALUES (?, ?, ?, ?, 'External', 'CUDA_GPU', ?, ?, ?)",
                   ("probe", IDENTIFIER, op_type, json.dumps({}), json.dumps(function),
                    "KernelEmitter,CudaEmitter,BlockCudaEmitter", json.dumps({"external_profile": {"time": "",
                                                                                                    "resource": 128}})))
    return path


def compile_model(model: Path, db: Path, out: Path) -> tuple[str, str]:
    out.mkdir()
    proc = subprocess.run([str(COMPILER), str(model), "-f", "onnx", f"-fkernel_cache_path={db}", "-min_log_level=0"],
                          cwd=out, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    return proc.stdout + proc.stderr, (out / "nnfusion_rt" / "cuda_codegen" / "nnfusion_rt.cu").read_text()


@pytest.mark.parametrize("op_type, used", [("BatchMatMul", False), ("Dot", True)])
def test_the_op_type_column_decides_and_the_identifier_matches(tmp_path: Path, op_type: str, used: bool):
    model = batched_matmul(tmp_path / "bmm.onnx")
    log, code = compile_model(model, probe_db(tmp_path / "k.db", op_type), tmp_path / "out")
    assert f"Trying to fetch kernel {IDENTIFIER} on DeviceType: CUDA_GPU" in log
    assert ("Unsupported op_type: BatchMatMul, ingore this fetch" in log) is not used
    assert (MARK in code) is used
    if not used:  # NNFusion's own: cuBLAS's batched GEMM
        assert "cublasSgemmStridedBatched" in code
