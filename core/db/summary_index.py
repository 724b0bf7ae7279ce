"""The browse index: one compact summary row per kernel, in a file of the console's own, so that paging,
sorting and filtering a million-row kernel DB answer within a keystroke.

Why a separate file: the NNFusion file must hold KernelCache alone (the compiler's contract), and any
question asked of KernelCache itself (a substring of identifiers, a sort by barriers) reads every row,
bodies included. This file keeps only what the browser shows and filters on, with an index per sortable
column and a trigram full-text index for substrings.

It is a cache and never the truth. A file signature (size, mtime, inode of the DB and its WAL; the WAL's
header) says when the DB may have changed; a sync then matches rows by (rowid, Key): rows gone are dropped, rows new are
summarised. Every write of ours gives a changed row a new rowid (delete + insert), so the match sees it;
an in-place UPDATE by another tool is only seen by `rebuild()` (the console's reload does one).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.db.engine import busy_timeout, connect, is_locked, locked_error, sqlite_uri, transaction
from core.db.state import state_dir
from core.kernels.lint import quick_problem
from core.kernels.math_kind import UNITS_SQL, precision

FORMAT_VERSION = "4"
BATCH_ROWS = 5000
# Substring filters shorter than a trigram cannot use the full-text index; nor is it worth it when a
# string matches this many rows: walking a sort index and testing each row finds a page sooner.
SELECTIVE_LIMIT = 2000

# The first problem the compiler would have with a row, found without reading its bodies (core.kernels.lint).
LINT_SQL = ("kdb_quick_problem(OpType, Attributes, Identifier, Source, DeviceType, Tags, json_valid(Function), "
            "json_valid(Miscs), CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.external_profile.time') END, "
            "CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.external_profile.resource') END)")
PRECISION_SQL = "kdb_precision(Identifier, Attributes)"  # core/kernels/math_kind.py
# What the browser shows of a KernelCache row, read from it without its bodies: (summary column, expression),
# in the order core.db.browse's KernelSummary reads them.
_SUMMARY = (
    ("key", "Key"), ("identifier", "Identifier"), ("op", "OpType"), ("source", "Source"),
    ("device", "DeviceType"), ("tags", "Tags"),
    ("grid", "CASE WHEN json_valid(Function) THEN json_extract(Function, '$.grid_dim') END"),
    ("block", "CASE WHEN json_valid(Function) THEN json_extract(Function, '$.block_dim') END"),
    ("barriers", "CASE WHEN json_valid(Function) THEN json_extract(Function, '$.num_syncthreads') END"),
    ("shared", "CASE WHEN json_valid(Function) THEN json_extract(Function, '$.shared_memory') END"),
    ("profile", "CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.external_profile.time') END"),
    ("resource", "CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.external_profile.resource') END"),
    ("name", "CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.kdb.name') END"),
    ("problem", LINT_SQL),
    ("precision", PRECISION_SQL),
    ("units", UNITS_SQL.format(function="Function")),
)
SUMMARY_COLUMNS = ", ".join(expr for _, expr in _SUMMARY)
ROW_COLUMNS = ", ".join(name for name, _ in _SUMMARY)

_TABLES = """
CREATE TABLE summary(
  rid INTEGER PRIMARY KEY,      -- KernelCache's rowid
  key TEXT NOT NULL, identifier, op, source, device, tags, grid, block, barriers, shared, profile,
  resource, name, problem, precision, units,
  threads, blocks               -- sortable products of block_dim and grid_dim
);
-- What the text filter looks in; computed, not stored (a million rows would carry 150 MB more).
CREATE VIEW summary_search AS
  SELECT rid, identifier || char(10) || coalesce(name, '') || char(10) || key AS search FROM summary;
CREATE TABLE meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_INDEXES = """
-- Ties are broken by rowid, which every index entry carries: (op, rid) order costs no extra bytes.
-- The default sort's index also holds what the text filter tests, so a walk along it reads a row only
-- when it matches (1M rows, a filter matching a third of them: 370 -> 70 ms).
CREATE INDEX by_op ON summary(op, rid, identifier, name, key);
CREATE INDEX by_identifier ON summary(identifier);
CREATE INDEX by_source ON summary(source);
CREATE INDEX by_device ON summary(device);
CREATE INDEX by_tags ON summary(tags);
CREATE INDEX by_barriers ON summary(barriers);
CREATE INDEX by_threads ON summary(threads);
CREATE INDEX by_blocks ON summary(blocks);
CREATE INDEX by_key ON summary(key);
CREATE INDEX by_problem ON summary(problem != '');
CREATE INDEX by_math ON summary(precision, units);
CREATE VIRTUAL TABLE search_text USING fts5(search, content='summary_search', content_rowid='rid',
                                            tokenize='trigram', detail='none');
CREATE TRIGGER summary_added AFTER INSERT ON summary BEGIN
  INSERT INTO search_text(rowid, search)
    VALUES (new.rid, new.identifier || char(10) || coalesce(new.name, '') || char(10) || new.key);
END;
CREATE TRIGGER summary_removed AFTER DELETE ON summary BEGIN
  INSERT INTO search_text(search_text, rowid, search)
    VALUES ('delete', old.rid, old.identifier || char(10) || coalesce(old.name, '') || char(10) || old.key);
END;
"""
_SELECT_NEW = f"""
INSERT INTO summary(rid, {ROW_COLUMNS}, threads, blocks)
SELECT rid, {ROW_COLUMNS},
  json_extract(block, '$[0]') * json_extract(block, '$[1]') * json_extract(block, '$[2]'),
  json_extract(grid, '$[0]') * json_extract(grid, '$[1]') * json_extract(grid, '$[2]')
FROM (SELECT rowid AS rid, {', '.join(f'{expr} AS {name}' for name, expr in _SUMMARY)}
      FROM k.KernelCache WHERE {{where}})
"""


WAL_HEADER_BYTES = 32


def file_signature(db_path: Path) -> str:
    """What changes whenever a commit reaches the DB file or its WAL.

    (inode, size, mtime) of both files, and the WAL's header. A writer that finds the WAL checkpointed starts it
    again from its first frame with new salts in its header, and rewrites the same file at the same size: where the
    file system's clock is coarse (one tick per jiffy before Linux 6.13's fine-grained timestamps) its mtime can
    stay too, and only the header says another commit is there. Within one WAL, every commit appends frames."""
    parts: list[object] = []
    for path in (db_path, db_path.with_name(db_path.name + "-wal")):
        try:
            st = path.stat()
            parts.append([st.st_ino, st.st_size, st.st_mtime_ns])
        except FileNotFoundError:
            parts.append(None)
    parts.append(_wal_header(db_path.with_name(db_path.name + "-wal")))
    return json.dumps(parts)


def _wal_header(wal: Path) -> str | None:
    """The WAL's header (its checkpoint sequence and salts change each time the WAL starts again), None without one."""
    try:
        with wal.open("rb") as f:
            return f.read(WAL_HEADER_BYTES).hex()
    except FileNotFoundError:
        return None


def state_file_for(db_path: Path, folder: str, suffix: str) -> Path:
    """A file of the state dir that belongs to one kernel DB (named by a digest of its resolved path)."""
    digest = hashlib.sha256(str(db_path.expanduser().resolve()).encode("utf-8", "surrogatepass")).hexdigest()
    return state_dir() / folder / f"{digest[:24]}{suffix}"


def index_path_for(db_path: Path) -> Path:
    return state_file_for(db_path, "browse", ".sqlite")


@dataclass(frozen=True)
class SyncReport:
    rebuilt: bool
    added: int
    removed: int

    @property
    def changed(self) -> bool:
        return self.rebuilt or bool(self.added or self.removed)


Progress = Callable[[int, int], None]  # rows done, rows in all


class SummaryIndex:
    """The browse index of one kernel DB. Open with SummaryIndex.open(db_path); close() when done."""

    def __init__(self, path: Path, db_path: Path, conn: sqlite3.Connection) -> None:
        self.path, self.db_path, self.conn = path, db_path, conn

    @classmethod
    def open(cls, db_path: Path, path: Path | None = None) -> SummaryIndex:
        path = path or index_path_for(db_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return cls(path, db_path, _connect(path))
        except sqlite3.DatabaseError as exc:
            if is_locked(exc):
                raise locked_error(path, busy_timeout()) from exc
            _discard(path)  # not a database (any more): it is only a cache, start it again
            return cls(path, db_path, _connect(path))

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> SummaryIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ---------------------------------------------------------------------------------

    def _meta(self, name: str) -> str | None:
        try:
            row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        except sqlite3.OperationalError:
            return None  # not built yet
        return row[0] if row else None

    @property
    def ready(self) -> bool:
        """Built for this DB at least once (it may be stale: see fresh)."""
        return self._meta("format") == FORMAT_VERSION and self._meta("db_path") == str(self.db_path.resolve())

    @property
    def fresh(self) -> bool:
        return self.ready and self._meta("signature") == file_signature(self.db_path)

    @property
    def rows(self) -> int:
        return int(self._meta("rows") or 0)

    def op_types(self) -> list[tuple[str, int]]:
        return [(str(op), int(n)) for op, n in json.loads(self._meta("op_types") or "[]")]

    def forget(self, keys: list[str]) -> None:
        """Drop rows the caller has just deleted from the DB, so no page shows them until the next sync."""
        if not self.ready:
            return
        with self._transaction():
            self.conn.executemany("DELETE FROM summary WHERE key = ?", [(k,) for k in keys])

    # -- keeping in step -------------------------------------------------------------------------

    def sync(self, on_progress: Progress | None = None, should_cancel: Callable[[], bool] = lambda: False,
             *, force_rebuild: bool = False) -> SyncReport:
        """Bring the index in step with the DB (a no-op when the file has not changed since the last sync)."""
        if not force_rebuild and self.fresh:
            return SyncReport(False, 0, 0)
        signature = file_signature(self.db_path)  # taken first: a commit during the sync forces another
        self._attach()
        try:
            if force_rebuild or not self.ready:
                report = self._rebuild(on_progress, should_cancel)
            else:
                report = self._catch_up(on_progress, should_cancel)
            if report is None:
                return SyncReport(False, 0, 0)  # cancelled: the signature stays old, the next sync goes on
            total = self.conn.execute("SELECT count(*) FROM summary").fetchone()[0]
            ops = self.conn.execute("SELECT op, count(*) FROM summary GROUP BY op ORDER BY op").fetchall()
            self._write_meta(signature=signature, rows=str(total), op_types=json.dumps(ops))
            return report
        except sqlite3.DatabaseError as exc:
            if is_locked(exc):
                raise locked_error(self.path, busy_timeout()) from exc
            if isinstance(exc, sqlite3.OperationalError) or force_rebuild:
                raise
            # Damaged pages of the cache (never of the DB: that one is attached read-only): build it again.
            self.conn.close()
            _discard(self.path)
            self.conn = _connect(self.path)
            return self.sync(on_progress, should_cancel, force_rebuild=True)
        finally:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("DETACH DATABASE k")

    def _attach(self) -> None:
        self.conn.execute("ATTACH DATABASE ? AS k", (sqlite_uri(self.db_path, readonly=True),))

    def _write_meta(self, **values: str) -> None:
        with self._transaction():
            self.conn.executemany("INSERT OR REPLACE INTO meta(name, value) VALUES (?, ?)", list(values.items()))

    def _transaction(self, *, read: bool = False) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self.conn, self.path, write=not read)

    def _rebuild(self, on_progress: Progress | None, should_cancel: Callable[[], bool]) -> SyncReport | None:
        # executescript commits on its own: the layout is dropped and re-created in one script.
        self.conn.executescript(
            "DROP TRIGGER IF EXISTS summary_added; DROP TRIGGER IF EXISTS summary_removed;"
            "DROP TABLE IF EXISTS search_text; DROP VIEW IF EXISTS summary_search; DROP TABLE IF EXISTS summary; "
            "DROP TABLE IF EXISTS meta;" + _TABLES)
        total = self.conn.execute("SELECT count(*) FROM k.KernelCache").fetchone()[0]
        done, last = 0, -(2**63)
        while True:
            if should_cancel():
                return None
            with self._transaction():
                self.conn.execute(_SELECT_NEW.replace("{where}", "rowid > ? ORDER BY rowid LIMIT ?"),
                                  (last, BATCH_ROWS))
                got = self.conn.execute("SELECT count(*), max(rid) FROM summary WHERE rid > ?", (last,)).fetchone()
            if not got[0]:
                break
            done, last = done + got[0], got[1]
            if on_progress:
                on_progress(min(done, total), total)
        self.conn.executescript(_INDEXES + "INSERT INTO search_text(search_text) VALUES ('rebuild');")
        self._write_meta(format=FORMAT_VERSION, db_path=str(self.db_path.resolve()))
        return SyncReport(True, done, 0)

    def _catch_up(self, on_progress: Progress | None, should_cancel: Callable[[], bool]) -> SyncReport | None:
        # Rows gone, or whose rowid now holds another kernel; both sides are read from indexes (the Key index
        # of KernelCache covers rowid), never from the bodies.
        with self._transaction():
            removed = self.conn.execute(
                "DELETE FROM summary WHERE (rid, key) NOT IN (SELECT rowid, Key FROM k.KernelCache)").rowcount
            self.conn.execute("DROP TABLE IF EXISTS temp.new_rows")
            self.conn.execute("CREATE TEMP TABLE new_rows AS SELECT rowid AS rid FROM k.KernelCache "
                              "WHERE rowid NOT IN (SELECT rid FROM summary)")
        total = self.conn.execute("SELECT count(*) FROM temp.new_rows").fetchone()[0]
        done, last = 0, -(2**63)
        while done < total:
            if should_cancel():
                return None
            with self._transaction():
                batch = [r[0] for r in self.conn.execute(
                    "SELECT rid FROM temp.new_rows WHERE rid > ? ORDER BY rid LIMIT ?", (last, 500))]
                if not batch:
                    break
                marks = ", ".join("?" * len(batch))
                self.conn.execute(_SELECT_NEW.replace("{where}", f"rowid IN ({marks})"), batch)
            done, last = done + len(batch), batch[-1]
            if on_progress:
                on_progress(done, total)
        self.conn.execute("DROP TABLE IF EXISTS temp.new_rows")
        return SyncReport(False, done, removed)

    # -- reading ---------------------------------------------------------------------------------

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._transaction(read=True):
            return self.conn.execute(sql, params).fetchall()


def _connect(path: Path) -> sqlite3.Connection:
    conn = connect(path, readonly=False)  # switching to WAL is the first read: a non-database fails there
    conn.create_function("kdb_quick_problem", 10, quick_problem, deterministic=True)
    conn.create_function("kdb_precision", 2, precision, deterministic=True)
    return conn


def _discard(path: Path) -> None:
    for name in (path.name, path.name + "-wal", path.name + "-shm"):
        path.with_name(name).unlink(missing_ok=True)
