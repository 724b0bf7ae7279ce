"""osdi20-schema DBs convert into the current schema; identifiers are rebuilt, not copied."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from conftest import run_kdb, run_kdb_json

from core.db.kernel_db import KernelDB, Schema
from core.kernels.lint import lint_rows


def make_osdi20(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE KernelCache(identifier TEXT NOT NULL, platform TEXT NOT NULL, function TEXT NOT NULL,"
                 " tags TEXT DEFAULT '', profile TEXT DEFAULT '', resource INTEGER NOT NULL)")
    conv = {"op_type": "Convolution", "in_shape": [[1, 3, 8, 8], [4, 3, 3, 3]], "out_shape": [[1, 4, 6, 6]],
            "parameters": {"window_movement_strides": [1, 1], "window_dilation_strides": [1, 1],
                           "padding_below_diff": [0, 0]},
            "function_body": "float* compute = output0;\ncompute[0] = pad_temp_shared[0];",
            "shared_memory": {"symbol": ["pad_temp_shared"], "dtype": ["float"], "size": [27]},
            "num_sync": 2, "gridDim": [1, 1, 1], "blockDim": [32, 1, 1]}
    pool = {"op_type": "AvgPool", "in_shape": [[1, 4, 6, 6]], "out_shape": [[1, 4, 3, 3]],
            "parameters": {"window_shape": [2, 2], "window_stride": [2, 2], "padding_below": [0, 0]},
            "function_body": "", "num_sync": 0, "gridDim": [1, 1, 1], "blockDim": [32, 1, 1]}
    conn.execute("INSERT INTO KernelCache VALUES (?,?,?,?,?,?)",
                 ("Convolution1388438333146floatfloatfloat...", "CUDA", json.dumps(conv), "fast",
                  "Tesla V100-PCIE-16GB:5.5", 32))
    conn.execute("INSERT INTO KernelCache VALUES (?,?,?,?,?,?)", ("AvgPool...", "CUDA", json.dumps(pool), "fast", "", 32))
    fused = dict(conv, op_type="Fused_Convolution_Relu")
    conn.execute("INSERT INTO KernelCache VALUES (?,?,?,?,?,?)", ("Convolution...Relu", "CUDA", json.dumps(fused), "",
                                                                  "", 32))
    conn.commit()
    conn.close()


def test_convert_rewrites_rows_and_reports_the_ones_it_cannot(tmp_path: Path):
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    make_osdi20(old)
    before = old.read_bytes()
    proc, out = run_kdb_json("db", "convert", str(old), str(new))
    assert proc.returncode == 1, proc.stderr  # one row could not be converted
    assert out["converted"] == 2
    assert "padding_above" in out["failed"][0]["reason"]
    assert old.read_bytes() == before  # the old file is untouched
    with KernelDB.open(new) as db:
        assert db.schema is Schema.CURRENT
        (row,) = [r for r in db.iter_rows() if r.op_type == "Convolution"]
        # the fused kernel is written as the pair NNFusion needs: its CUDA_GPU row and the CUDA twin
        fused = {(r.op_type, r.device_type) for r in db.iter_rows() if r.op_type == "Fused_Convolution_Relu"}
        assert fused == {("Fused_Convolution_Relu", "CUDA_GPU"), ("Fused_Convolution_Relu", "CUDA")}
        assert row.identifier == ("Convolution1,3,8,8;4,3,3,3;1,4,6,6floatfloatfloat"
                                  "Strides{1, 1}Strides{1, 1}CoordinateDiff{0, 0}")
        fn = json.loads(row.function)
        assert fn["function_body"].startswith("__shared__ float pad_temp_shared[27];")
        assert json.loads(row.miscs)["external_profile"] == {"time": "Tesla V100-PCIE-16GB:5.5;", "resource": 32}
        assert [f for f in lint_rows(db.iter_raw()) if f.severity != "warning"] == []


def test_convert_refuses_to_overwrite(tmp_path: Path):
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    make_osdi20(old)
    new.write_bytes(b"")
    proc = run_kdb("db", "convert", str(old), str(new))
    assert proc.returncode == 2 and "exists" in proc.stderr


def test_a_copy_keeps_table_order_which_decides_the_kernel_nnfusion_takes(tmp_path: Path):
    """NNFusion takes an identifier's first row in table order. Two kernels of one op, inserted so that their
    Keys sort the other way round: the copy (convert_db of a current DB) keeps the first one first, where a
    walk in Key order (iter_rows) would hand the compiler the other kernel."""
    from dataclasses import replace

    from test_kernel_row import row_of

    from core.db.convert import convert_db
    from core.demo import demo_kernels

    first = row_of(demo_kernels()[0])
    second = replace(first, key="kdb:" + "0" * 64, miscs=first.miscs)  # sorts before any real Key
    assert second.key < first.key
    with KernelDB.open(tmp_path / "a.db", create=True) as db:
        db.insert(first)
        db.insert(second)
        assert [r.key for r in db.iter_rows()] == [second.key, first.key]
        assert [r.key for r in db.iter_table_order(batch=1)] == [first.key, second.key]
    convert_db(tmp_path / "a.db", tmp_path / "b.db")
    with KernelDB.open(tmp_path / "b.db") as db:
        assert [r.key for r in db.iter_table_order()] == [first.key, second.key]
