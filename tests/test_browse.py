"""The Kernels browser's queries: pages in a stable order, sorting by values inside Function, filters."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from core.db.browse import KernelFilter, count_kernels, count_kernels_indexed, list_kernels, list_kernels_indexed
from core.db.kernel_db import KernelDB
from core.db.summary_index import SummaryIndex
from core.kernels.kernel_row import KernelRow


def kernel(key: str, barriers: int, op: str = "Relu") -> KernelRow:
    fn = {"function_signature": "x", "function_body": "", "grid_dim": [1, 1, 1], "block_dim": [barriers + 1, 1, 1],
          "block_function_body": "", "shared_memory": {"symbol": [], "dtype": [], "size": []},
          "num_syncthreads": barriers}
    ident = f"{op}2;2floatfloat"
    attrs = json.dumps({"input_shape": [[2]], "output_shape": [[2]]})
    return KernelRow(key, ident, op, attrs, "External", "CUDA_GPU", json.dumps(fn),
                     "KernelEmitter,CudaEmitter,BlockCudaEmitter", json.dumps({"kdb": {"name": f"name_{key}"}}))


def filled(tmp_path: Path, n: int = 23) -> KernelDB:
    db = KernelDB.open(tmp_path / "k.db", create=True)
    for i in range(n):
        db.insert(kernel(f"k{i:02d}", barriers=(i * 7) % 5))
    return db


def test_pages_cover_every_row_once_in_order(tmp_path: Path):
    with filled(tmp_path) as db:
        pages = [list_kernels(db, offset=o, limit=5) for o in range(0, 25, 5)]
        keys = [k.key for page in pages for k in page]
        assert keys == sorted(keys) and len(keys) == 23 == count_kernels(db)
        assert [len(p) for p in pages] == [5, 5, 5, 5, 3]


def test_sorting_by_a_value_inside_function(tmp_path: Path):
    with filled(tmp_path) as db:
        got = [(k.barriers, k.key) for k in list_kernels(db, sort="barriers", descending=True, limit=0)]
        assert got == sorted(got, reverse=True)  # ties in Key order, the same direction
        assert got[0][0] == 4 and {k.name for k in list_kernels(db, limit=3)} == {"name_k00", "name_k01", "name_k02"}


def test_filters_by_text_and_lint(tmp_path: Path):
    with filled(tmp_path) as db:
        conn = sqlite3.connect(db.path)
        conn.execute("UPDATE KernelCache SET Identifier = 'wrong' WHERE Key = 'k05'")
        conn.commit()
        conn.close()
        problems = list_kernels(db, KernelFilter(lint="problems"))
        assert [(k.key, k.problem) for k in problems] == [("k05", "Identifier does not match Attributes")]
        assert count_kernels(db, KernelFilter(lint="ok")) == 22
        assert [k.key for k in list_kernels(db, KernelFilter(text="name_k1"))] == [f"k1{i}" for i in range(10)]


def test_text_filter_takes_like_wildcards_literally(tmp_path: Path):
    """'_' and '%' in what is typed are characters, not LIKE's wildcards (kernel names are full of '_')."""
    with filled(tmp_path, n=3) as db:
        conn = sqlite3.connect(db.path)
        conn.execute("""UPDATE KernelCache SET Miscs = '{"kdb": {"name": "conv_relu"}}' WHERE Key = 'k00'""")
        conn.execute("""UPDATE KernelCache SET Miscs = '{"kdb": {"name": "convXrelu"}}' WHERE Key = 'k01'""")
        conn.execute("""UPDATE KernelCache SET Miscs = '{"kdb": {"name": "conv%relu"}}' WHERE Key = 'k02'""")
        conn.commit()
        conn.close()
        assert [k.key for k in list_kernels(db, KernelFilter(text="v_r"))] == ["k00"]
        assert [k.key for k in list_kernels(db, KernelFilter(text="v%r"))] == ["k02"]
        assert count_kernels(db, KernelFilter(text="V_R")) == 1  # ASCII case is ignored
        with SummaryIndex.open(db.path) as index:  # the console's pages: the same answer
            index.sync()
            assert [k.key for k in list_kernels_indexed(index, KernelFilter(text="v_r"))] == ["k00"]
            assert count_kernels_indexed(index, KernelFilter(text="v%r")) == 1
