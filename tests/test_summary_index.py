"""The browse index answers exactly what the kernel DB itself answers, and follows every kind of write."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sqlite3
from pathlib import Path

import pytest

import core.db.summary_index as summary_index
from core.db.browse import (
    KernelFilter,
    count_kernels,
    count_kernels_indexed,
    list_kernels,
    list_kernels_indexed,
)
from core.db.kernel_db import KernelDB
from core.db.summary_index import SummaryIndex
from core.kernels.kernel_row import KernelRow


def kernel(i: int) -> KernelRow:
    op = ("Relu", "Add", "Dot", "Sigmoid")[i % 4]
    n = 2 + i % 7
    block = [1 + i % 5, 1 + i % 2, 1]
    fn = {"function_signature": "x", "function_body": "", "grid_dim": [i % 3 + 1, 1, 1], "block_dim": block,
          "block_function_body": "", "shared_memory": {"symbol": [], "dtype": [], "size": []},
          "num_syncthreads": i % 4}
    if op == "Dot":
        ident, attrs = f"Dot{n},{n};{n},{n};{n},{n}floatfloatfloat", {"input_shape": [[n, n], [n, n]],
                                                                          "output_shape": [[n, n]]}
    elif op == "Add":
        ident, attrs = f"Add{n};{n};{n}floatfloatfloat", {"input_shape": [[n], [n]], "output_shape": [[n]]}
    else:
        ident, attrs = f"{op}{n};{n}floatfloat", {"input_shape": [[n]], "output_shape": [[n]]}
    tags = "KernelEmitter,CudaEmitter,BlockCudaEmitter" + (",fast" if i % 5 == 0 else "")
    miscs = {"kdb": {"name": f"Kernel_{i:03d}_x"}}
    if i % 3 == 0:
        miscs["external_profile"] = {"time": f"NVIDIA H200:{(i + 1) / 10:.1f};", "resource": 4}
    return KernelRow(f"kdb:{i:04d}", ident, op, json.dumps(attrs), "External", "CUDA_GPU", json.dumps(fn), tags,
                     json.dumps(miscs))


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KernelDB:
    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    handle = KernelDB.open(tmp_path / "kernel_cache.db", create=True)
    for i in range(60):
        handle.insert(kernel(i))
    yield handle
    handle.close()


def same_views(db: KernelDB, index: SummaryIndex, flt: KernelFilter, sort: str, descending: bool) -> None:
    direct = list_kernels(db, flt, sort=sort, descending=descending, limit=0)
    indexed = list_kernels_indexed(index, flt, sort=sort, descending=descending, limit=0)
    assert indexed == direct, (flt, sort, descending)
    assert count_kernels_indexed(index, flt) == count_kernels(db, flt) == len(direct)
    page = list_kernels_indexed(index, flt, sort=sort, descending=descending, offset=3, limit=5)
    assert page == direct[3:8]


FILTERS = [KernelFilter(), KernelFilter(text="kernel_01"), KernelFilter(text="DOT"), KernelFilter(text="x"),
           KernelFilter(text="kdb:00"), KernelFilter(text="nothing matches"), KernelFilter(text="_"),
           KernelFilter(op_type="Add"), KernelFilter(tag="fast"), KernelFilter(lint="problems"),
           KernelFilter(lint="ok", text="relu"), KernelFilter(source="External", device="CUDA_GPU", op_type="Dot")]


@pytest.mark.parametrize("selective_limit", [2000, 1])  # the trigram path, and the walk along a sort index
def test_index_answers_what_the_db_answers(db: KernelDB, selective_limit: int, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(summary_index, "SELECTIVE_LIMIT", selective_limit)
    monkeypatch.setattr("core.db.browse.SELECTIVE_LIMIT", selective_limit)
    conn = sqlite3.connect(db.path)  # one row the compiler could not use: it must show up under lint problems
    conn.execute("UPDATE KernelCache SET Identifier = 'wrong' WHERE Key = 'kdb:0007'")
    conn.commit()
    conn.close()
    with SummaryIndex.open(db.path) as index:
        assert index.sync().rebuilt
        for flt, sort, descending in itertools.product(FILTERS, ["op", "identifier", "barriers", "threads", "key"],
                                                       [False, True]):
            same_views(db, index, flt, sort, descending)
        assert [k.key for k in list_kernels_indexed(index, KernelFilter(lint="problems"))] == ["kdb:0007"]


def test_sync_follows_inserts_deletes_replacements_and_profile_updates(db: KernelDB, tmp_path: Path):
    writer = KernelDB.open(db.path, write=True)
    with SummaryIndex.open(db.path) as index:
        index.sync()
        assert index.fresh and index.rows == 60 and index.sync() == summary_index.SyncReport(False, 0, 0)
        conn = sqlite3.connect(db.path)  # another tool's INSERT OR REPLACE, reusing the highest rowid
        conn.execute("DELETE FROM KernelCache WHERE rowid = (SELECT max(rowid) FROM KernelCache)")
        conn.execute("INSERT INTO KernelCache SELECT 'kdb:other', Identifier, OpType, Attributes, Source, DeviceType, "
                     "Function, Tags, Miscs FROM KernelCache WHERE Key = 'kdb:0005'")
        conn.commit()
        conn.close()
        writer.insert(kernel(100))
        writer.delete(["kdb:0001", "kdb:0002"])
        writer.insert(dataclasses.replace(kernel(3), op_type="Relu"), replace=True)  # same Key, new content: the old row goes, the new one has a new rowid
        writer.update_miscs("kdb:0004", {"external_profile": {"time": "NVIDIA H200:0.5;", "resource": 1}})
        assert not index.fresh
        report = index.sync()
        assert report.changed and not report.rebuilt and index.fresh
        for flt in FILTERS:
            same_views(db, index, flt, "op", False)
        assert [k.key for k in list_kernels_indexed(index, KernelFilter(text="kdb:0"), sort="key")][-2:] == [
            "kdb:0058", "kdb:0100"] and list_kernels_indexed(index, KernelFilter(text="other"))
        assert list_kernels_indexed(index, KernelFilter(text="kdb:0004"))[0].times == {"NVIDIA H200": 0.5}
        assert list_kernels_indexed(index, KernelFilter(text="kdb:0003"))[0].op_type == "Relu"
    writer.close()
    assert db.tables() == ["KernelCache"]  # the index lives in the console's state dir
    assert index.path.is_relative_to(tmp_path / "state")


def test_a_cancelled_build_is_finished_by_the_next_sync(db: KernelDB, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(summary_index, "BATCH_ROWS", 10)
    seen: list[tuple[int, int]] = []
    with SummaryIndex.open(db.path) as index:
        report = index.sync(lambda done, total: seen.append((done, total)), should_cancel=lambda: len(seen) >= 2)
        assert not report.changed and not index.fresh and seen == [(10, 60), (20, 60)]
        assert index.sync(lambda done, total: seen.append((done, total))).rebuilt and index.fresh
        assert seen[-1] == (60, 60)
        same_views(db, index, KernelFilter(), "op", False)


def test_a_commit_in_a_wal_started_again_at_the_same_size_within_one_clock_tick_is_seen(db: KernelDB):
    """A checkpoint lets the next writer start the WAL again from its first frame: the file keeps its inode and its
    size, and on a coarse file-system clock (a jiffy before Linux 6.13) its mtime too. The clock is held still here
    (os.utime puts both files' mtimes back, as one tick would): the index must still see the commit."""
    import os

    wal = db.path.with_name(db.path.name + "-wal")
    # Another reader keeps the WAL file in place between writers, as the console's open handles do.
    keeper = sqlite3.connect(db.path)
    keeper.execute("SELECT count(*) FROM KernelCache").fetchone()
    db.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.insert(kernel(100))  # the WAL grows to its size for one row's insert
    db.connection().execute("PRAGMA wal_checkpoint(PASSIVE)")
    with SummaryIndex.open(db.path) as index:
        index.sync()
        assert index.fresh and index.rows == 61
        times = {path: (path.stat().st_atime_ns, path.stat().st_mtime_ns) for path in (db.path, wal)}
        size = wal.stat().st_size
        db.delete(["kdb:0100"])  # the WAL started again: a one-row delete in the same frames' room
        db.connection().execute("PRAGMA wal_checkpoint(PASSIVE)")
        assert wal.stat().st_size == size, "the WAL was reused at the same size (the case this test is about)"
        for path, ns in times.items():
            os.utime(path, ns=ns)  # one clock tick: the mtimes as they were
        assert not index.fresh, "a commit the signature missed: pages would show the deleted row"
        assert index.sync().removed == 1 and index.rows == 60
    keeper.close()


def test_forget_hides_deleted_rows_before_the_next_sync(db: KernelDB):
    with SummaryIndex.open(db.path) as index:
        index.sync()
        index.forget(["kdb:0010"])
        assert not list_kernels_indexed(index, KernelFilter(text="kdb:0010"))


def test_an_index_file_that_is_not_a_database_is_started_again(db: KernelDB):
    path = summary_index.index_path_for(db.path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an sqlite file, " * 100)
    with SummaryIndex.open(db.path) as index:
        assert index.sync().rebuilt and index.rows == 60
