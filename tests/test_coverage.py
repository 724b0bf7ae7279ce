"""Coverage: which op configs of a model have a kernel in the DB for the device, which to tune, which fall back."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("onnx")

from conftest import run_kdb, run_kdb_json
from onnx_models import depthwise_block, mlp, resnet, resnet_block, write

from core.db.kernel_db import KernelDB
from core.kernels.kernel_row import KernelRow
from core.kernels.ops import BASE_TAGS
from core.opconfigs.coverage import IN_DB, MISSING, coverage
from core.opconfigs.onnx_extract import extract
from core.opconfigs.opconfig import OpConfig

FUNCTION = {"function_signature": 'extern "C" __global__  void (float* input0, float* input1, float* output0)',
            "function_body": "", "grid_dim": [1, 1, 1], "block_dim": [1, 1, 1], "block_function_body": "",
            "shared_memory": {"symbol": [], "dtype": [], "size": []}, "num_syncthreads": 0}


def kernel_row(config: OpConfig, device: str = "CUDA_GPU", extra_tags: tuple[str, ...] = ()) -> KernelRow:
    """A row as injection would write it for this op config (the kernel body does not matter here)."""
    sig = config.signature()
    tags = ",".join((*BASE_TAGS, *extra_tags))
    key = "test:" + hashlib.sha256(f"{sig.identifier}|{device}|{tags}".encode()).hexdigest()
    return KernelRow(key, sig.identifier, sig.op_type, json.dumps(sig.attributes()), "External", device,
                     json.dumps(FUNCTION), tags, json.dumps({"external_profile": {"time": "", "resource": 32}}))


def make_db(path: Path, rows: list[KernelRow]) -> Path:
    with KernelDB.open(path, create=True) as db:
        for row in rows:
            db.insert(row)
    return path


def test_resnet_block_one_kernel_in_db_one_missing(tmp_path: Path):
    ext = extract(write(resnet_block(), tmp_path / "block.onnx"))
    conv_relu, conv_add_relu = ext.configs
    # A ROCm kernel for the second op does not count for CUDA_GPU.
    db_path = make_db(tmp_path / "k.db", [kernel_row(conv_relu), kernel_row(conv_add_relu, device="ROCM_GPU")])
    with KernelDB.open(db_path) as db:
        entries = coverage(ext, db)
    assert [(e.config, e.count, e.kernels, e.status, e.fallback) for e in entries] == [
        (conv_relu, 1, 1, IN_DB, "cuDNN + element-wise kernels (not fused)"),
        (conv_add_relu, 1, 0, MISSING, "cuDNN + element-wise kernels (not fused)"),
    ]
    assert [e.identifier for e in entries] == [c.signature().identifier for c in ext.configs]
    with KernelDB.open(db_path) as db:
        assert coverage(ext, db, device_type="ROCM_GPU")[1].status == IN_DB


def test_depthwise_conv_falls_back_and_the_rest_are_missing(tmp_path: Path):
    ext = extract(write(depthwise_block(), tmp_path / "dw.onnx"))
    with KernelDB.open(make_db(tmp_path / "k.db", [])) as db:
        entries = coverage(ext, db)
    assert [(e.config.op_type, e.identifier is None, e.kernels, e.fallback) for e in entries] == [
        ("Convolution", True, 0, "DepthwiseConv2dNative (NNFusion's kernel)"),
        ("Relu", False, 0, "NNFusion's element-wise kernel"),
        ("Fused_Convolution_Relu", False, 0, "cuDNN + element-wise kernels (not fused)"),
    ]
    assert entries[0].status == ("falls back: depthwise convolution (groups=32) has no kernel-DB op type; "
                                 "NNFusion emits DepthwiseConv2dNative")
    assert [e.status for e in entries[1:]] == [MISSING, MISSING]


def test_a_dot_needs_its_transpose_tags(tmp_path: Path):
    ext = extract(write(mlp(), tmp_path / "mlp.onnx"))
    gemm1 = ext.configs[0]  # transB
    rows = [kernel_row(gemm1), kernel_row(ext.configs[2], extra_tags=("transB",))]
    with KernelDB.open(make_db(tmp_path / "k.db", rows)) as db:
        entries = coverage(ext, db)
    assert [(e.config.op_type, e.kernels, e.fallback) for e in entries] == [
        ("Dot", 0, "cuBLAS"), ("Relu", 0, "NNFusion's element-wise kernel"), ("Dot", 1, "cuBLAS"),
        ("Relu", 0, "NNFusion's element-wise kernel"), ("Dot", 0, "cuBLAS")]


def test_one_count_query_per_distinct_identifier(tmp_path: Path):
    ext = extract(write(resnet(widths=(8, 16, 32, 64), size=64), tmp_path / "big.onnx"))
    rows = [kernel_row(c) for c in ext.configs[:5]]
    with KernelDB.open(make_db(tmp_path / "k.db", rows)) as db:
        statements: list[str] = []
        db.connection().set_trace_callback(statements.append)
        entries = coverage(ext, db)
    identifiers = {e.identifier for e in entries}
    queries = [s for s in statements if "KernelCache" in s]
    assert len(queries) == len(identifiers) == len(ext.configs)
    # The trace shows each statement with its parameters bound: one Identifier's count each time.
    assert all(re.search(r"count\(\*\).* WHERE Identifier = '[^']+' AND DeviceType = 'CUDA_GPU'", q) for q in queries)
    assert [e.status for e in entries[:5]] == [IN_DB] * 5 and {e.status for e in entries[5:]} == {MISSING}


def test_cli_coverage_json_and_table(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    ext = extract(model)
    db_path = make_db(tmp_path / "k.db", [kernel_row(ext.configs[0])])
    proc, data = run_kdb_json("coverage", "--db", str(db_path), str(model))
    assert proc.returncode == 1  # a missing op is a finding
    assert (data["model"], data["device_type"], data["summary"]) == ("resnet_block", "CUDA_GPU",
                                                                     {IN_DB: 1, MISSING: 1})
    assert [(e["config"]["op_type"], e["status"], e["kernels"]) for e in data["entries"]] == [
        ("Fused_Convolution_Relu", IN_DB, 1), ("Fused_Convolution_Add_Relu", MISSING, 0)]
    assert data["flops_in_db"] == pytest.approx(0.5)
    proc = run_kdb("coverage", "--db", str(db_path), str(model), env={"COLUMNS": "200"})
    assert proc.returncode == 1 and "1 in DB, 1 missing (tune these)" in proc.stdout


def test_cli_coverage_without_a_db_is_exit_2(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    proc = run_kdb("coverage", "--db", str(tmp_path / "none.db"), str(model))
    assert proc.returncode == 2 and "no kernel DB" in proc.stderr
