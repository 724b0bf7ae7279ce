"""kdb lint finds every row the compiler could never fetch or would crash on."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import run_kdb_json

from core.db.kernel_db import NNFUSION_DDL
from core.errors import InputError
from core.kernels.lint import lint_row, lint_rows
from core.kernels.profile import format_profile, merge_profile, parse_profile

GOOD_FN = {"function_signature": 'extern "C" __global__  void (float* input0, float* output0)',
           "function_body": "", "grid_dim": [1, 1, 1], "block_dim": [32, 1, 1], "block_function_body": "",
           "shared_memory": {"symbol": [], "dtype": [], "size": []}, "num_syncthreads": 0}
GOOD = (1, "k", "Relu2,3;2,3floatfloat", "Relu", json.dumps({"input_shape": [[2, 3]], "output_shape": [[2, 3]]}),
        "External", "CUDA_GPU", json.dumps(GOOD_FN), "KernelEmitter,CudaEmitter,BlockCudaEmitter",
        json.dumps({"external_profile": {"time": "NVIDIA H200:1.5;", "resource": 32}}))


def with_(**changes) -> tuple:
    cols = ["rowid", "Key", "Identifier", "OpType", "Attributes", "Source", "DeviceType", "Function", "Tags", "Miscs"]
    row = list(GOOD)
    for name, value in changes.items():
        row[cols.index(name)] = value
    return tuple(row)


def test_a_good_row_has_no_findings():
    assert lint_row(GOOD) == []
    standalone = with_(Source="Antares", Tags="KernelEmitter,CudaEmitter")  # core/db/standalone.py's form
    assert lint_row(standalone) == []


@pytest.mark.parametrize(("changes", "severity", "check"), [
    ({"Miscs": None}, "crash", "null"),
    ({"Function": ""}, "crash", "json"),
    ({"Attributes": '{"x": NaN}'}, "crash", "json"),
    ({"OpType": "Fused_Convolution_Batchnorm"}, "unreachable", "op-type"),
    ({"DeviceType": "CUDA"}, "unreachable", "device-type"),
    ({"Tags": "KernelEmitter,CudaEmitter"}, "crash", "tags"),
    ({"Source": "Antares", "Tags": "KernelEmitter"}, "crash", "tags"),  # selected, then CHECK-fails
    ({"Miscs": json.dumps({"external_profile": {"time": "H200:abc;", "resource": 1}})}, "crash", "profile"),
    ({"Miscs": json.dumps({"external_profile": {"time": "H200:1.0;", "resource": "32"}})}, "crash", "profile"),
    ({"Miscs": json.dumps({"external_profile": {"resource": 32}})}, "crash", "profile"),
    ({"Function": json.dumps({**GOOD_FN, "grid_dim": [1, 1]})}, "crash", "function"),
    ({"Function": json.dumps({k: v for k, v in GOOD_FN.items() if k != "num_syncthreads"})}, "crash", "function"),
    ({"Identifier": "Relu2,3;2,3float"}, "unreachable", "identifier"),
    # BlockCudaEmitter declares shared_memory's entries pairwise: lists of unequal length, or a size of 0
    ({"Function": json.dumps({**GOOD_FN, "shared_memory": {"symbol": ["a", "b"], "dtype": ["float"],
                                                          "size": [8, 8]}})}, "crash", "function"),
    ({"Function": json.dumps({**GOOD_FN, "shared_memory": {"symbol": ["a"], "dtype": ["float"],
                                                          "size": [8, 8]}})}, "crash", "function"),
    ({"Function": json.dumps({**GOOD_FN, "shared_memory": {"symbol": ["a"], "dtype": ["float"],
                                                          "size": [0]}})}, "crash", "function"),
    ({"Function": json.dumps({**GOOD_FN, "shared_memory": {"symbol": ["a"], "dtype": ["float"]}})},
     "crash", "function"),
])
def test_each_problem_is_found_with_its_severity(changes, severity, check):
    findings = lint_row(with_(**changes))
    assert any(f.severity == severity and f.check == check for f in findings), findings


def test_an_unsupported_op_type_poisons_its_identifier_neighbours():
    bad = with_(rowid=2, Key="k2", OpType="Fused_Convolution_Batchnorm")
    findings = list(lint_rows([GOOD, bad]))
    assert any(f.rowid == 1 and f.check == "poisoned" for f in findings)


def test_kdb_lint_json_and_exit_status(tmp_path: Path):
    db = tmp_path / "k.db"
    conn = sqlite3.connect(db)
    conn.execute(NNFUSION_DDL)
    conn.execute("INSERT INTO KernelCache VALUES (?,?,?,?,?,?,?,?,?)", GOOD[1:])
    conn.execute("INSERT INTO KernelCache VALUES (?,?,?,?,?,?,?,?,?)", with_(Key="k2", Tags="KernelEmitter")[1:])
    conn.commit()
    conn.close()
    proc, out = run_kdb_json("lint", "--db", str(db))
    assert proc.returncode == 1
    assert out["rows"] == 2 and [f["key"] for f in out["findings"]] == ["k2"]


def test_profile_strings_round_trip_and_reject_what_stof_would():
    assert parse_profile("NVIDIA H200:12.5;Tesla V100-PCIE-16GB:30.1;") == {"NVIDIA H200": 12.5,
                                                                           "Tesla V100-PCIE-16GB": 30.1}
    assert merge_profile("Tesla V100:3;", "NVIDIA H200", 1.25) == "Tesla V100:3;NVIDIA H200:1.25;"
    for bad, why in (("H200:abc;", "is not a time"), ("H200:1.0", "does not end with ';'"), (":1;", "no device"),
                     ("H200:nan;", "is not a time"), ("H200:-1;", "is not a time"), ("H200;", "has no ':'")):
        with pytest.raises(InputError, match=why):
            parse_profile(bad)
    with pytest.raises(InputError, match="cannot go into a profile string"):
        format_profile({"a:b": 1.0})


@pytest.mark.parametrize("zero", ["0", "0.0", "0e5", ".0", " 0 ", "0.000000"])
def test_a_profile_time_of_zero_is_refused(zero: str):
    """NNFusion picks the smallest time: a 0 would win every comparison without a kernel ever running."""
    with pytest.raises(InputError, match="time must be positive"):
        parse_profile(f"NVIDIA H200:{zero};")
    with pytest.raises(InputError, match="not a positive finite number"):
        format_profile({"NVIDIA H200": float(zero)})
    with pytest.raises(InputError, match="not a positive finite number"):
        merge_profile("Tesla V100:3;", "NVIDIA H200", float(zero))
    assert any(f.check == "profile" for f in lint_row(with_(Miscs=json.dumps(
        {"external_profile": {"time": f"NVIDIA H200:{zero};", "resource": 32}}))))


def test_a_profile_time_with_a_control_character_is_an_input_error():
    """Found by the fuzz test: str.strip() took '\x1f' for whitespace, float() did not, and a ValueError escaped."""
    assert parse_profile("H200: 12.5 ;") == {"H200": 12.5}  # the whitespace std::stof skips
    for bad in ("H200:0\x1f;", "H200:\x1c1;", "H200:1\x85;"):
        with pytest.raises(InputError, match="is not a time in microseconds"):
            parse_profile(bad)


def spilling(stores: int) -> str:
    resources = {"registers": 32, "shared_bytes": 0, "spill_stores": stores, "spill_loads": stores}
    return json.dumps({"external_profile": {"time": "NVIDIA H200:1.5;", "resource": 32},
                       "kdb": {"compile": {"sm_90": {"kdb_kernel": resources, "kdb_block_kernel": resources}}}})


def test_a_fused_kernels_twin_does_not_repeat_its_body_findings():
    """The CUDA twin is never compiled (the pattern pass only checks a Function is there): a spill is said once,
    on the CUDA_GPU row."""
    kernel = with_(OpType="Fused_Convolution_Relu", Miscs=spilling(3024))
    twin = with_(rowid=2, Key="k#CUDA", OpType="Fused_Convolution_Relu", DeviceType="CUDA", Miscs=spilling(3024))
    assert "register-spill" in {f.check for f in lint_row(kernel)}
    assert "register-spill" not in {f.check for f in lint_row(twin)}
    assert [f.rowid for f in lint_rows([kernel, twin]) if f.check == "register-spill"] == [1]


def test_a_kernel_ptxas_spills_is_a_warning_naming_the_arch_and_bytes():
    """What the nvcc check recorded (Miscs.kdb.compile): a tuned conv with 3 KB of spills ran 7x its tuning."""
    findings = lint_row(with_(Miscs=spilling(3024)))
    assert [(f.severity, f.check) for f in findings] == [("warning", "register-spill")]
    assert "sm_90: ptxas spills 3024 bytes per thread (32 registers)" in findings[0].message
    assert lint_row(with_(Miscs=spilling(36))) == []  # a few bytes: no finding
