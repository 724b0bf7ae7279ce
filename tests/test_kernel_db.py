"""The kernel DB file: NNFusion's exact DDL, nothing else in it, WAL, osdi20 read-only, idempotent inserts."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from core.db.kernel_db import NNFUSION_DDL, InsertOutcome, KernelDB, Schema
from core.errors import DbError
from core.kernels.kernel_row import KernelRow

EXPECTED_SQL = """CREATE TABLE KernelCache(
   Key        TEXT NOT NULL,
   Identifier TEXT NOT NULL,
   OpType     TEXT NOT NULL,
   Attributes TEXT DEFAULT "",
   Source     TEXT DEFAULT "External",
   DeviceType TEXT NOT NULL,
   Function   TEXT NOT NULL,
   Tags       TEXT DEFAULT "",
   Miscs      TEXT DEFAULT "",
   PRIMARY KEY(Key)
   )"""


def row(key: str = "k1", ident: str = "Relu2;2floatfloat", miscs: str = "{}") -> KernelRow:
    fn = {"function_signature": "x", "function_body": "", "grid_dim": [1, 1, 1], "block_dim": [1, 1, 1],
          "block_function_body": "", "shared_memory": {"symbol": [], "dtype": [], "size": []}, "num_syncthreads": 0}
    return KernelRow(key, ident, "Relu", json.dumps({"input_shape": [[2]], "output_shape": [[2]]}), "External",
                     "CUDA_GPU", json.dumps(fn), "KernelEmitter,CudaEmitter,BlockCudaEmitter", miscs)


def test_ddl_is_nnfusions_exactly(tmp_path: Path):
    KernelDB.open(tmp_path / "k.db", create=True).close()
    conn = sqlite3.connect(tmp_path / "k.db")
    assert conn.execute("SELECT sql FROM sqlite_master WHERE name = 'KernelCache'").fetchone()[0] == EXPECTED_SQL
    info = conn.execute("PRAGMA table_info(KernelCache)").fetchall()
    assert [(c[1], c[2], c[3], c[4], c[5]) for c in info] == [
        ("Key", "TEXT", 1, None, 1), ("Identifier", "TEXT", 1, None, 0), ("OpType", "TEXT", 1, None, 0),
        ("Attributes", "TEXT", 0, '""', 0), ("Source", "TEXT", 0, '"External"', 0),
        ("DeviceType", "TEXT", 1, None, 0), ("Function", "TEXT", 1, None, 0), ("Tags", "TEXT", 0, '""', 0),
        ("Miscs", "TEXT", 0, '""', 0)]
    # The NNFusion file holds that table and nothing else (SQLite's own autoindex aside).
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert names == {"KernelCache", "sqlite_autoindex_KernelCache_1"}
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_db_created_by_the_compilers_ddl_opens_for_writing(tmp_path: Path):
    conn = sqlite3.connect(tmp_path / "nn.db")
    conn.execute(NNFUSION_DDL)
    conn.commit()
    conn.close()
    with KernelDB.open(tmp_path / "nn.db", write=True) as db:
        assert db.schema is Schema.CURRENT
        assert db.insert(row()).outcome is InsertOutcome.INSERTED


def test_inserts_are_idempotent_and_replace_is_explicit(tmp_path: Path):
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        assert db.insert(row()).outcome is InsertOutcome.INSERTED
        assert db.insert(row()).outcome is InsertOutcome.UNCHANGED
        changed = row(miscs='{"kdb": {"name": "other"}}')
        result = db.insert(changed)
        assert result.outcome is InsertOutcome.UNCHANGED and "--replace" in result.note
        assert db.find("k1")[0].miscs == "{}"
        assert db.insert(changed, replace=True).outcome is InsertOutcome.REPLACED
        assert db.find("k1")[0].miscs == changed.miscs
        # replace also drops other implementations of the same identifier
        db.insert(row(key="k2"))
        result = db.insert(row(key="k3"), replace=True)
        assert result.outcome is InsertOutcome.REPLACED
        assert {r.key for r in db.find("Relu2;2floatfloat")} == {"k3"}
        assert db.count() == 1


def test_delete_and_restore_round_trip(tmp_path: Path):
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        db.insert(row("a"))
        db.insert(row("b"))
        gone = db.delete(["a", "missing"])
        assert [r.key for r in gone] == ["a"] and db.count() == 1
        assert db.restore(gone) == 1
        assert db.find("a")[0] == row("a")


def test_osdi20_schema_opens_read_only(tmp_path: Path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE KernelCache(identifier TEXT NOT NULL, platform TEXT NOT NULL, function TEXT NOT NULL,"
                 " tags TEXT DEFAULT '', profile TEXT DEFAULT '', resource INTEGER NOT NULL)")
    conn.commit()
    conn.close()
    with KernelDB.open(path) as db:
        assert db.schema is Schema.OSDI20 and db.readonly
    with pytest.raises(DbError, match="osdi20"):
        KernelDB.open(path, write=True)


@pytest.mark.parametrize("content", [b"not a database at all" * 10, b"SQLite format 3\x00" + b"\xff" * 84])
def test_non_sqlite_files_are_refused_before_sqlite_opens_them(tmp_path: Path, content: bytes):
    path = tmp_path / "bogus.db"
    path.write_bytes(content)
    with pytest.raises(DbError):
        KernelDB.open(path)
    assert path.read_bytes() == content


def test_missing_db_is_not_created_by_readers(tmp_path: Path):
    with pytest.raises(DbError, match="kdb db init"):
        KernelDB.open(tmp_path / "nope.db")
    assert not (tmp_path / "nope.db").exists()


def test_the_wal_is_cut_back_once_readers_let_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("core.db.engine.WAL_SIZE_LIMIT_BYTES", 100_000)
    wal = tmp_path / "k.db-wal"
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        db.insert(row(key="first"))
        reader = sqlite3.connect(db.path)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM KernelCache").fetchone()  # a snapshot the WAL must keep
        for i in range(20):  # about 4 MB that cannot be checkpointed past the reader
            db.insert(row(key=f"k{i}", miscs=json.dumps({"pad": "x" * 200_000})))
        assert wal.stat().st_size > 2_000_000
        reader.close()
        sqlite3.connect(db.path).execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        db.insert(row(key="last"))  # the first write after a full checkpoint restarts the WAL
        assert wal.stat().st_size <= 100_000


def test_a_profile_written_to_a_kernel_does_not_hand_the_compiler_another(tmp_path: Path):
    """NNFusion takes a lookup's first row in table order. Writing Miscs moves a row to a new rowid (the browse
    index's change signal); the rows of its lookup that followed it move behind it, so the first stays first:
    for a plain kernel and for a fused kernel's pair (CUDA_GPU and its CUDA twin)."""
    import sys
    from dataclasses import replace

    sys.path.insert(0, str(Path(__file__).parent))
    from test_kernel_row import row_of

    from core.demo import demo_kernels

    for item in (demo_kernels()[0], next(i for i in demo_kernels() if i["op_type"] == "Fused_Convolution_Relu")):
        first = row_of(item)
        second = replace(first, key=first.key[:-8] + "00000000")
        db_path = tmp_path / f"{item['op_type']}.db"
        with KernelDB.open(db_path, create=True) as db:
            db.insert(first)
            db.insert(second)
            before = {dt: [r[1] for r in db.fetch_like_compiler(first.identifier, dt)] for dt in ("CUDA_GPU", "CUDA")}
            miscs = json.loads(first.miscs)
            miscs["external_profile"]["time"] = "NVIDIA H200:12.5;"
            db.update_miscs(first.key, miscs)
            after = {dt: [r[1] for r in db.fetch_like_compiler(first.identifier, dt)] for dt in ("CUDA_GPU", "CUDA")}
            assert after == before and after["CUDA_GPU"][0] == first.key
            written = next(r for r in db.iter_rows() if r.key == first.key)
            assert json.loads(written.miscs)["external_profile"]["time"] == "NVIDIA H200:12.5;"
