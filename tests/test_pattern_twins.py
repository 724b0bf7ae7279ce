"""Fused kernels are two rows: CUDA_GPU (the kernel) and its CUDA twin (for the pattern-substitution pass).

NNFusion substitutes Convolution+Relu / Convolution+Add+Relu only when a CUDA row of the fused identifier is
there, then fetches the Matched_Pattern's kernel under CUDA_GPU (../shared/nnfusion/README.md). So every write
keeps the pair in step, lint flags either half alone, and `kdb db repair` adds missing twins and nothing else.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from core.db.kernel_db import InsertOutcome, KernelDB
from core.kernels.kernel_row import (
    COLUMNS,
    KernelRow,
    distinct_kernels,
    pattern_twin,
    primary_key,
    twin_key,
)
from core.kernels.lint import CRASH, UNREACHABLE, lint_rows
from core.kernels.opsig import signature_from_attributes

FN = {"function_signature": 'extern "C" __launch_bounds__(64) __global__ void (float* input0, float* input1, '
                            "float* output0)",
      "function_body": "output0[threadIdx.x] = input0[threadIdx.x];", "grid_dim": [1, 1, 1], "block_dim": [64, 1, 1],
      "block_function_body": "output0[threadIdx.x] = input0[threadIdx.x];",
      "shared_memory": {"symbol": [], "dtype": [], "size": []}, "num_syncthreads": 0}
TAGS = "KernelEmitter,CudaEmitter,BlockCudaEmitter"


def fused_row(key: str = "kdb:fused1", out_channels: int = 8, miscs: str = "{}",
              op_type: str = "Fused_Convolution_Relu") -> KernelRow:
    attrs = {"input_shape": [[1, 4, 8, 8], [out_channels, 4, 3, 3]], "output_shape": [[1, out_channels, 8, 8]],
             "parameters": {"window_movement_strides": [1, 1], "window_dilation_strides": [1, 1],
                            "padding_below_diff": [1, 1]}}
    ident = signature_from_attributes(op_type, attrs).identifier
    return KernelRow(key, ident, op_type, json.dumps(attrs), "External", "CUDA_GPU", json.dumps(FN), TAGS, miscs)


def plain_row(key: str = "kdb:plain") -> KernelRow:
    attrs = {"input_shape": [[2]], "output_shape": [[2]]}
    ident = signature_from_attributes("Relu", attrs).identifier
    return KernelRow(key, ident, "Relu", json.dumps(attrs), "External", "CUDA_GPU", json.dumps(FN), TAGS, "{}")


def stored(path: Path) -> dict[str, tuple[str, ...]]:
    conn = sqlite3.connect(path)
    try:
        return {r[0]: tuple(r) for r in conn.execute(f"SELECT {', '.join(COLUMNS)} FROM KernelCache")}
    finally:
        conn.close()


def raw_insert(path: Path, *rows: KernelRow) -> None:
    """Rows written the way other tools write them (NNFusion's import script: no twin)."""
    conn = sqlite3.connect(path)
    conn.executemany(f"INSERT INTO KernelCache ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     [r.values() for r in rows])
    conn.commit()
    conn.close()


def lint_db(path: Path) -> list:
    conn = sqlite3.connect(path)
    try:
        return list(lint_rows(conn.execute(f"SELECT rowid, {', '.join(COLUMNS)} FROM KernelCache")))
    finally:
        conn.close()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    KernelDB.open(tmp_path / "k.db", create=True).close()
    return tmp_path / "k.db"


def test_a_fused_kernel_is_written_as_its_pair(db_path: Path):
    row = fused_row()
    with KernelDB.open(db_path, write=True) as db:
        assert db.insert(row).outcome is InsertOutcome.INSERTED
        assert db.insert(row).outcome is InsertOutcome.UNCHANGED
    rows = stored(db_path)
    assert set(rows) == {row.key, twin_key(row.key)}
    twin = rows[twin_key(row.key)]
    assert twin == pattern_twin(row).values()
    assert twin[COLUMNS.index("DeviceType")] == "CUDA"
    # every other column as the kernel's own row: the pass checks only that a Function is there
    assert [v for c, v in zip(COLUMNS, twin, strict=True) if c not in ("Key", "DeviceType")] == \
           [v for c, v in zip(COLUMNS, row.values(), strict=True) if c not in ("Key", "DeviceType")]
    assert primary_key(twin_key(row.key)) == row.key


def test_an_unfused_kernel_is_one_row(db_path: Path):
    with KernelDB.open(db_path, write=True) as db:
        db.insert(plain_row())
    assert list(stored(db_path)) == ["kdb:plain"]


def test_replace_leaves_exactly_the_new_pair(db_path: Path):
    old, new = fused_row("kdb:old"), fused_row("kdb:new", miscs='{"kdb": {"name": "new"}}')
    with KernelDB.open(db_path, write=True) as db:
        db.insert(old)
        result = db.insert(new, replace=True)
    assert result.outcome is InsertOutcome.REPLACED
    assert {r.key for r in result.replaced} == {"kdb:old", "kdb:old#CUDA"}
    assert set(stored(db_path)) == {"kdb:new", "kdb:new#CUDA"}


@pytest.mark.parametrize("which", ["kernel", "twin"])
def test_deleting_either_half_deletes_the_pair_and_undo_restores_both(db_path: Path, which: str):
    row = fused_row()
    with KernelDB.open(db_path, write=True) as db:
        db.insert(row)
        db.insert(plain_row())
        before = stored(db_path)
        removed = db.delete([row.key if which == "kernel" else twin_key(row.key)])
        assert {r.key for r in removed} == {row.key, twin_key(row.key)}
        assert set(stored(db_path)) == {"kdb:plain"}
        assert db.restore(removed) == 2
    assert stored(db_path) == before


def test_a_profile_update_reaches_the_twin(db_path: Path):
    row = fused_row()
    miscs = {"external_profile": {"time": "NVIDIA H200:12.5;", "resource": 64}}
    with KernelDB.open(db_path, write=True) as db:
        db.insert(row)
        db.update_miscs(row.key, miscs)
    rows = stored(db_path)
    miscs_col = COLUMNS.index("Miscs")
    assert json.loads(rows[row.key][miscs_col]) == miscs
    assert rows[twin_key(row.key)][miscs_col] == rows[row.key][miscs_col]


def test_lint_accepts_the_pair_and_flags_each_half_alone(tmp_path: Path):
    paired, kernel_only, twin_only = (tmp_path / f"{n}.db" for n in ("paired", "kernel_only", "twin_only"))
    for p in (paired, kernel_only, twin_only):
        KernelDB.open(p, create=True).close()
    row = fused_row()
    with KernelDB.open(paired, write=True) as db:
        db.insert(row)
    assert lint_db(paired) == []
    raw_insert(kernel_only, row)
    (finding,) = lint_db(kernel_only)
    assert (finding.severity, finding.check, finding.key) == (UNREACHABLE, "pattern-twin", row.key)
    assert "never used" in finding.message
    raw_insert(twin_only, pattern_twin(row))
    (finding,) = lint_db(twin_only)
    assert (finding.severity, finding.check, finding.key) == (CRASH, "pattern-twin", twin_key(row.key))
    assert "aborts" in finding.message


def test_one_cuda_row_serves_every_kernel_of_its_identifier(db_path: Path):
    # The compiler asks per identifier: a second CUDA_GPU kernel of the same op needs no second twin.
    first, second = fused_row("kdb:a"), fused_row("kdb:b", miscs='{"kdb": {"name": "b"}}')
    raw_insert(db_path, first, second, pattern_twin(first))
    assert lint_db(db_path) == []
    with KernelDB.open(db_path) as db:
        assert db.pair_problems() == ([], [])


def test_pair_problems_and_add_twins_touch_nothing_else(db_path: Path):
    a, b, lone_twin = fused_row("kdb:a"), fused_row("kdb:b", out_channels=16), pattern_twin(fused_row("kdb:c", 4))
    raw_insert(db_path, a, b, plain_row(), lone_twin)
    before = stored(db_path)
    with KernelDB.open(db_path, write=True) as db:
        unused, orphans = db.pair_problems()
        assert {r.key for r in unused} == {"kdb:a", "kdb:b"}
        assert [r.key for r in orphans] == ["kdb:c#CUDA"]
        written = db.add_twins([r.key for r in unused])
        assert [r.key for r in written] == ["kdb:a#CUDA", "kdb:b#CUDA"]
        assert db.add_twins(["kdb:a", "kdb:plain"]) == []  # idempotent; never a twin for an unfused row
        assert db.pair_problems() == ([], [lone_twin])
    after = stored(db_path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) == {"kdb:a#CUDA", "kdb:b#CUDA"}


def test_distinct_kernels_counts_a_pair_once():
    row = fused_row()
    got = list(distinct_kernels([pattern_twin(row), row, plain_row()]))
    assert [r.key for r in got] == [row.key, "kdb:plain"]
    assert got[0] == row
