"""Every real kernel of the Rammer artifact injects, with the nvcc compile check for sm_90."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from pathlib import Path

from conftest import KERNELS, artifact_items, needs_artifact, run_kdb_json

from core.cuda.barriers import count_barriers
from core.cuda.source import parse_kernel
from core.kernels.kernel_json import validate_item

pytestmark = needs_artifact


def test_every_artifact_kernel_parses_and_has_a_proven_barrier_count():
    items = artifact_items()
    assert len(items) >= 130
    for file, index, item in items:
        spec = validate_item(item)
        src = parse_kernel(spec.code)
        result = count_barriers(src, spec.block, spec.grid)
        assert result.count is not None, f"{file}#{index}: {result.reason}"
        naive = src.masked.count("__syncthreads")
        assert result.count >= min(naive, 1), f"{file}#{index}"


def test_artifact_directory_injects_with_compile_check(tmp_path: Path):
    db = tmp_path / "k.db"
    proc, report = run_kdb_json("inject", "--db", str(db), "--arch", "sm_90", "--workers", "2", str(KERNELS))
    assert proc.returncode == 0, proc.stderr + json.dumps(report["failures"][:3])
    assert report["failed"] == 0
    # The artifact repeats some kernels verbatim (the sample file copies the AlexNet conv+add+relu ones).
    total = len(artifact_items())
    assert report["injected"] + report["unchanged"] == total
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM KernelCache WHERE DeviceType = 'CUDA_GPU'").fetchone()[0] \
        == report["injected"]
    # every fused kernel also has its CUDA twin (else the compiler never substitutes the pattern), nothing else
    twins = conn.execute("SELECT Key, OpType FROM KernelCache WHERE DeviceType = 'CUDA'").fetchall()
    fused = conn.execute("SELECT Key FROM KernelCache WHERE DeviceType = 'CUDA_GPU' AND OpType LIKE 'Fused%'")
    assert sorted(k for k, _ in twins) == sorted(k + "#CUDA" for (k,) in fused)
    assert twins and {op for _, op in twins} <= {"Fused_Convolution_Relu", "Fused_Convolution_Add_Relu"}
    for fn, miscs, tags in conn.execute("SELECT Function, Miscs, Tags FROM KernelCache"):
        function, misc = json.loads(fn), json.loads(miscs)
        assert "BlockCudaEmitter" in tags.split(",")
        # NNFusion's own CudaEmitter form: the block size as launch bounds (registers fit the block)
        threads = math.prod(function["block_dim"])
        assert function["function_signature"].startswith(
            f'extern "C" __launch_bounds__({threads}) __global__ void (float* input0')
        assert not re.search(r"__shared__\s+float\s+\w+\s*\[", function["block_function_body"])
        assert misc["external_profile"]["time"] == ""  # nothing measured, nothing claimed
        assert misc["kdb"]["compile"]["sm_90"]["kdb_block_kernel"]["registers"] > 0
    # Re-injecting changes nothing.
    proc, again = run_kdb_json("inject", "--db", str(db), "--no-compile", str(KERNELS))
    assert proc.returncode == 0 and again["injected"] == 0 and again["unchanged"] == total


def test_fused_add_relu_signature_puts_the_bias_before_the_output(tmp_path: Path):
    item = json.loads((KERNELS / "sample_fused_conv_add_relu_alexnet.json").read_text())[0]
    db = tmp_path / "k.db"
    src = tmp_path / "one.json"
    src.write_text(json.dumps(item))
    _, report = run_kdb_json("inject", "--db", str(db), "--no-compile", str(src))
    assert report["injected"] == 1, report
    fn = json.loads(sqlite3.connect(db).execute("SELECT Function FROM KernelCache").fetchone()[0])
    assert fn["function_signature"] == (f'extern "C" __launch_bounds__({math.prod(item["blockDim"])}) __global__ void '
                                        "(float* input0, float* input1, float* input2, float* output0)")
    assert fn["block_function_body"].startswith("float* compute = output0;")
    assert fn["shared_memory"] == {"symbol": ["pad_temp_shared", "input1_shared"], "dtype": ["float", "float"],
                                   "size": [227, 88]}
    assert fn["num_syncthreads"] == 66
