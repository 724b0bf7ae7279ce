"""NNFusion's kernel DB file: open it, create it exactly as the compiler does, read and write rows.

The file holds the KernelCache table and nothing else (the console's own state lives elsewhere).
Every write is one short IMMEDIATE transaction, because the compiler opens the file with no busy
timeout and would fail on a long-held lock. The older osdi20 schema is recognised and only read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from core.db.engine import busy_timeout, check_sqlite_file, connect, is_locked, locked_error, quick_check, transaction
from core.db.op_rows import (
    KnownOps,
    OpRow,
    OrderProblem,
    op_rows,
    order_problems,
    restore_order,
    standalone_columns,
    standalone_product,
)
from core.errors import DbError
from core.kernels.kernel_row import (
    COLUMNS,
    KernelRow,
    is_pattern_twin,
    needs_pattern_twin,
    pattern_twin,
    primary_key,
    twin_key,
)
from core.kernels.ops import DEVICE_TYPE, EXTERNAL_SOURCE, FUSED_OP_TYPES, PATTERN_DEVICE_TYPE

_SELECT = f"SELECT {', '.join(COLUMNS)} FROM KernelCache"
_INSERT = f"INSERT INTO KernelCache ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"

# Byte for byte the DDL of NNFusion's KernelCacheManager (engine/cache/manager.cpp).
NNFUSION_DDL = """CREATE TABLE IF NOT EXISTS KernelCache(
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
   );"""

OSDI20_COLUMNS = ("identifier", "platform", "function", "tags", "profile", "resource")


class Schema(Enum):
    EMPTY = "empty"  # no KernelCache table yet
    CURRENT = "current"
    OSDI20 = "osdi20"  # the osdi20_artifact branch's table: read-only here
    UNKNOWN = "unknown"


class InsertOutcome(Enum):
    INSERTED = "inserted"
    UNCHANGED = "unchanged"
    REPLACED = "replaced"


@dataclass(frozen=True, slots=True)
class InsertResult:
    outcome: InsertOutcome
    replaced: tuple[KernelRow, ...] = ()  # rows this insert removed (for undo/backups)
    note: str = ""
    standalone_for: str = ""  # the product the row went in standalone for, as its op's other rows are


class DeletedRows(list[KernelRow]):
    """Rows a delete removed, with the rowid each had: `restore` puts rows of equal rank back in their place."""

    def __init__(self, rows: Iterable[KernelRow] = (), rowids: dict[str, int] | None = None) -> None:
        super().__init__(rows)
        self.rowids = rowids or {}


def default_db_path() -> Path:
    env = os.environ.get("KDB_DB")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "nnfusion" / "kernel_cache.db"


def kernel_db_path(given: Path | str | None = None) -> Path:
    """The DB a command works on: the path given (--db), else $KDB_DB, else NNFusion's default."""
    return Path(given).expanduser() if given else default_db_path()


def init_command(path: Path) -> str:
    """The one command that creates the DB at `path` (`--db` named unless it is the default)."""
    return "kdb db init" + ("" if path == default_db_path() else f" --db {shlex.quote(str(path))}")


class KernelDB:
    """One kernel DB file. Open with KernelDB.open(); close() when done (or use `with`)."""

    def __init__(self, path: Path, *, readonly: bool, schema: Schema, conn: sqlite3.Connection) -> None:
        self.path = path
        self.readonly = readonly
        self.schema = schema
        self._conn: sqlite3.Connection | None = conn
        # The -fproduct_name whose times order each op's rows (core/db/op_rows.py); None: the product_name setting
        self.order_product: str | None = None
        self._known_ops = KnownOps()
        self._batch: sqlite3.Connection | None = None  # the write transaction batch() holds open

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str | None = None, *, write: bool = False, create: bool = False) -> KernelDB:
        """Open a kernel DB. write=True refuses the osdi20 schema; create=True makes the file and table."""
        path = kernel_db_path(path)
        check_sqlite_file(path)
        if not path.exists():
            if not create:
                raise DbError(f"no kernel DB at {path} (`{init_command(path)}` creates one)")
            path.parent.mkdir(parents=True, exist_ok=True)
        elif (write or create) and path.stat().st_size > 0:
            # Look before writing: even the switch to WAL writes the header, so what a writer must refuse
            # (damage inside, which the header check misses; the osdi20 layout) is found read-only first.
            quick_check(path)
            with cls.open(path) as probe:
                if probe.schema is Schema.OSDI20:
                    raise _osdi20_is_read_only(path)
        conn = connect(path, readonly=not (write or create))
        try:
            schema = _detect_schema(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if is_locked(exc):
                raise locked_error(path, busy_timeout()) from exc
            raise DbError(f"{path} cannot be read as a kernel DB: {exc}") from exc
        if schema is Schema.UNKNOWN or (schema is Schema.OSDI20 and (write or create)):
            conn.close()
            raise _osdi20_is_read_only(path) if schema is Schema.OSDI20 else DbError(
                f"{path} has a KernelCache table of an unknown layout")
        db = cls(path, readonly=not (write or create), schema=schema, conn=conn)
        if create and schema is Schema.EMPTY:
            db.init()
        return db

    @classmethod
    def create_if_missing(cls, path: Path | str | None = None) -> bool:
        """Make the DB at `path` with NNFusion's exact table when there is no file yet, or a file without the table
        (as the compiler itself does when it opens a DB); True when it did. A file of another kind is refused as
        open() refuses it."""
        path = kernel_db_path(path)
        if path.exists():
            with cls.open(path) as db:
                if db.schema is not Schema.EMPTY:
                    return False
        cls.open(path, create=True).close()
        return True

    def init(self) -> None:
        with transaction(self.connection(), self.path, write=True) as conn:
            conn.execute(NNFUSION_DDL)
        self.schema = Schema.CURRENT

    def close(self) -> None:
        if self._conn is None:
            return
        if not self.readonly:
            # The last connection to close takes an exclusive lock while it checkpoints and removes the WAL;
            # a reader opening then (the compiler has no busy timeout) gets SQLITE_BUSY. Checkpointing now,
            # without waiting on anyone, leaves that window next to nothing to copy.
            with contextlib.suppress(sqlite3.Error):  # best effort: closing goes on whatever it says
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # autocommit: no BEGIN around it
        self._conn.close()
        self._conn = None

    def __enter__(self) -> KernelDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self) -> sqlite3.Connection:
        """The DB's one connection, in autocommit mode: use reading() or writing() for transactions."""
        if self._conn is None:
            raise DbError(f"{self.path} is closed")
        return self._conn

    def reading(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A read transaction (deferred: it never takes the write lock); inside batch(), its transaction."""
        if self._batch is not None:
            return contextlib.nullcontext(self._batch)
        return transaction(self.connection(), self.path, write=False)

    def writing(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE: writers queue on the busy timeout); inside batch(), its
        transaction."""
        self._require_writable()
        if self._batch is not None:
            return contextlib.nullcontext(self._batch)
        return transaction(self.connection(), self.path, write=True)

    @contextlib.contextmanager
    def batch(self) -> Iterator[sqlite3.Connection]:
        """One write transaction around several writes (a maintenance plan's): every read and write of this
        handle inside it joins it, and all of them commit together or none does."""
        if self._batch is not None:
            raise DbError(f"{self.path}: a batch is open already")
        with self.writing() as raw:
            self._batch = raw
            try:
                yield raw
            finally:
                self._batch = None

    # -- writing ---------------------------------------------------------------------------

    def _require_writable(self) -> None:
        if self.readonly:
            raise DbError(f"{self.path} is open read-only")
        if self.schema is not Schema.CURRENT:
            raise DbError(f"{self.path} has no KernelCache table of the current schema")

    def insert(self, row: KernelRow, *, replace: bool = False) -> InsertResult:
        """Insert one kernel in one transaction. Same Key: unchanged (replace: rewritten if it differs).

        With replace, every other row of the same Identifier and DeviceType is removed too, so the DB
        then holds exactly this kernel for that op. A fused kernel is written as its pair of rows
        (CUDA_GPU and its CUDA twin, see core/kernels/ops.py), both in the same transaction.

        The hot path of injection.
        """
        return self._write(lambda raw: self._insert_in_transaction(raw, row, replace))

    def ordering_product(self) -> str:
        """The product whose times order each op's rows: `order_product`, else the product_name setting (read once;
        empty: each op is ranked by the one GPU its rows were timed on)."""
        if self.order_product is None:
            from core.settings import load_settings

            self.order_product = load_settings().product_name
        return self.order_product

    def _keep_order(self, raw: sqlite3.Connection, identifiers: Iterable[str],
                    places: dict[str, int] | None = None) -> None:
        """Every write ends here, in its transaction: the ops it touched fastest-first again (core/db/op_rows.py)."""
        for identifier in dict.fromkeys(identifiers):
            restore_order(raw, identifier, self.ordering_product(), places)

    def _write(self, body: Any) -> Any:
        """Run body(the sqlite3 connection) in one write transaction."""
        with self.writing() as raw:
            return body(raw)

    def _insert_in_transaction(self, raw: sqlite3.Connection, row: KernelRow, replace: bool) -> InsertResult:
        others = op_rows(raw, row.identifier) if self._known_ops.may_have(raw, row.identifier) else []
        self._known_ops.add(row.identifier)
        standalone = standalone_product(others) \
            if row.device_type == DEVICE_TYPE and row.source == EXTERNAL_SOURCE else None
        if standalone is not None:  # an External row would be taken first and fuse the op again: keep it standalone
            source, tags, miscs = standalone_columns(row, standalone)
            row = dataclasses.replace(row, source=source, tags=tags,
                                      miscs=json.dumps(miscs, ensure_ascii=False, allow_nan=False))
        result = self._insert_row(raw, row, replace)
        if result.outcome is not InsertOutcome.UNCHANGED and others and not replace and row.device_type == DEVICE_TYPE:
            # the op's rows now: the others as they were, then this one (a new rowid, found by its Key's index)
            (rowid,) = raw.execute("SELECT rowid FROM KernelCache WHERE Key = ?", (row.key,)).fetchone()
            now = [r for r in others if r.key != row.key] + [OpRow(rowid, row.key, row.source, row.tags, row.miscs)]
            restore_order(raw, row.identifier, self.ordering_product(), rows=now)
        return dataclasses.replace(result, standalone_for=standalone or "") \
            if standalone is not None and result.outcome is not InsertOutcome.UNCHANGED else result

    @classmethod
    def _insert_row(cls, raw: sqlite3.Connection, row: KernelRow, replace: bool) -> InsertResult:
        values = row.values()
        existing = raw.execute(f"{_SELECT} WHERE Key = ?", (row.key,)).fetchone()
        removed: list[KernelRow] = []
        if replace:
            removed = cls._remove_others(raw, row.identifier, row.device_type, row.key)
            if needs_pattern_twin(row):
                removed += cls._remove_others(raw, row.identifier, PATTERN_DEVICE_TYPE, twin_key(row.key))
        if existing is not None:
            same = tuple(existing) == values
            if same or not replace:
                cls._sync_twin(raw, KernelRow.from_values(tuple(existing)))
                if removed:
                    return InsertResult(InsertOutcome.REPLACED, tuple(removed))
                note = "" if same else "a row with this Key differs (use --replace to rewrite it)"
                return InsertResult(InsertOutcome.UNCHANGED, note=note)
            removed.append(KernelRow.from_values(tuple(existing)))
            raw.execute("DELETE FROM KernelCache WHERE Key = ?", (row.key,))
        raw.execute(_INSERT, values)
        cls._sync_twin(raw, row)
        return InsertResult(InsertOutcome.REPLACED if removed else InsertOutcome.INSERTED, tuple(removed))

    @staticmethod
    def _remove_others(raw: sqlite3.Connection, identifier: str, device_type: str, keep: str) -> list[KernelRow]:
        where = "WHERE Identifier = ? AND DeviceType = ? AND Key != ?"
        others = raw.execute(f"{_SELECT} {where}", (identifier, device_type, keep)).fetchall()
        if others:
            raw.execute(f"DELETE FROM KernelCache {where}", (identifier, device_type, keep))
        return [KernelRow.from_values(tuple(o)) for o in others]

    @staticmethod
    def _sync_twin(raw: sqlite3.Connection, row: KernelRow) -> bool:
        """Make a fused kernel's CUDA twin equal to what its CUDA_GPU row implies; True if it was written."""
        if not needs_pattern_twin(row):
            return False
        twin = pattern_twin(row)
        existing = raw.execute(f"{_SELECT} WHERE Key = ?", (twin.key,)).fetchone()
        if existing is not None and tuple(existing) == twin.values():
            return False
        KernelDB._rewrite_in_order(raw, twin.key, twin.values())
        return True

    @staticmethod
    def _rewrite_in_order(raw: sqlite3.Connection, key: str, values: tuple[Any, ...]) -> None:
        """Write the row `key` anew (a new rowid: the browse index sees changed rows by (rowid, Key)) and move
        the rows of its Identifier and DeviceType that came after it behind it, in their order (a fused kernel's
        CUDA twin: CUDA_GPU rows are put in order by op_rows.restore_order instead)."""
        old = raw.execute("SELECT rowid, Identifier, DeviceType FROM KernelCache WHERE Key = ?", (key,)).fetchone()
        followers: list[Any] = []
        if old is not None:
            followers = raw.execute(f"{_SELECT} WHERE Identifier = ? AND DeviceType = ? AND rowid > ? ORDER BY rowid",
                                    (old[1], old[2], old[0])).fetchall()
            _rewrite_at_end(raw, key, values)
        else:
            raw.execute(_INSERT, values)
        for follower in followers:
            raw.execute("DELETE FROM KernelCache WHERE Key = ?", (follower[0],))
            raw.execute(_INSERT, tuple(follower))

    def has_key(self, key: str) -> bool:
        # A plain autocommit read: no write lock.
        return self.connection().execute("SELECT 1 FROM KernelCache WHERE Key = ?", (key,)).fetchone() is not None

    def delete(self, keys: Sequence[str], *, keep_rows: bool = True) -> DeletedRows:
        """Delete rows by Key in one transaction; returns them (with their rowids) so the caller can undo
        (keep_rows=False: their Keys and rowids only, for a caller whose undo file holds them).

        A fused kernel's pair goes together: deleting either row deletes its partner (a CUDA twin left
        alone would make the compiler abort; a CUDA_GPU row without its twin is never used). The rows left keep
        their order, so each op stays fastest-first."""

        def body(raw: sqlite3.Connection) -> DeletedRows:
            out = DeletedRows()
            for key in keys:
                got = raw.execute(f"{_SELECT} WHERE Key = ?", (key,)).fetchone()
                if got is None:
                    continue
                row = KernelRow.from_values(tuple(got))
                partner = twin_key(row.key) if needs_pattern_twin(row) else (
                    primary_key(row.key) if is_pattern_twin(row) else None)
                for k in (row.key, partner):
                    if k is None:
                        continue
                    found = raw.execute(f"SELECT rowid, {', '.join(COLUMNS)} FROM KernelCache WHERE Key = ?",
                                        (k,)).fetchone()
                    if found is not None:
                        if keep_rows:
                            out.append(KernelRow.from_values(tuple(found[1:])))
                        out.rowids[k] = found[0]
                        raw.execute("DELETE FROM KernelCache WHERE Key = ?", (k,))
            return out

        return self._write(body)

    def restore(self, rows: Iterable[KernelRow]) -> int:
        """Put rows back exactly as they were (undo of a delete); existing keys are left alone. Each op is then
        fastest-first again; rows `delete` gave (DeletedRows) go back to their place among rows of equal rank."""
        places = rows.rowids if isinstance(rows, DeletedRows) else {}

        def body(raw: sqlite3.Connection) -> int:
            n, touched = 0, []
            for row in rows:
                n += raw.execute(_INSERT.replace("INSERT", "INSERT OR IGNORE", 1), row.values()).rowcount or 0
                if row.device_type == DEVICE_TYPE:
                    touched.append(row.identifier)
                    self._known_ops.add(row.identifier)
            self._keep_order(raw, touched, places)
            return n

        return self._write(body)

    def update_miscs(self, key: str, miscs: dict[str, Any]) -> None:
        """Rewrite one row's Miscs (a profile, a verification); a fused kernel's twin follows."""
        self._update_column(key, "Miscs", miscs)

    def update_function(self, key: str, function: dict[str, Any]) -> None:
        """Rewrite one row's Function (`kdb db repair`); its Key, which names the kernel's code, stays."""
        self._update_column(key, "Function", function)

    def _update_column(self, key: str, column: str, value: dict[str, Any]) -> None:
        self.update_rows([(key, {column: json.dumps(value, ensure_ascii=False, allow_nan=False)})])

    def update_rows(self, updates: Sequence[tuple[str, dict[str, str]]]) -> None:
        """Rewrite columns of rows by Key ({column name: text}), all in one transaction; a fused kernel's twin
        follows. Keys the DB does not have are skipped."""
        unknown = {c for _key, values in updates for c in values} - (set(COLUMNS) - {"Key"})
        if unknown:
            raise ValueError(f"not columns of KernelCache that may change: {sorted(unknown)}")

        def body(raw: sqlite3.Connection) -> None:
            places: dict[str, int] = {}
            touched: list[str] = []
            for key, values in updates:
                # Moved to a new rowid rather than updated in place: the browse index (core/db/summary_index.py)
                # sees changed rows by their (rowid, Key) pair without reading any bodies. Its old rowid is its
                # place among rows of equal rank when the op is put in order again.
                got = raw.execute(f"SELECT rowid, {', '.join(COLUMNS)} FROM KernelCache WHERE Key = ?",
                                  (key,)).fetchone()
                if got is None:
                    continue
                row = KernelRow.from_values(tuple(got[1:]))
                updated = KernelRow.from_values(tuple(values.get(c, v) for c, v in zip(COLUMNS, got[1:], strict=True)))
                _rewrite_at_end(raw, key, updated.values())
                places.setdefault(key, got[0])
                touched += [r.identifier for r in (row, updated) if r.device_type == DEVICE_TYPE]
                self._known_ops.add(updated.identifier)
                if raw.execute("SELECT 1 FROM KernelCache WHERE Key = ?", (twin_key(row.key),)).fetchone():
                    self._sync_twin(raw, updated)
            self._keep_order(raw, touched, places)

        self._write(body)

    def order_problems(self) -> list[OrderProblem]:
        """Ops whose rows are not fastest-first (written by another tool, or by kdb before it kept the order)."""
        self._require_current()
        with self.reading() as raw:
            return order_problems(raw, self.ordering_product())

    def put_in_order(self, identifiers: Iterable[str]) -> list[str]:
        """Put these ops' rows fastest-first, in one transaction; the Keys moved."""
        return self._write(lambda raw: [key for identifier in dict.fromkeys(identifiers)
                                        for key in restore_order(raw, identifier, self.ordering_product())])

    def iter_op_rows(self, identifiers: Iterable[str]) -> Iterator[KernelRow]:
        """Every row (any DeviceType) of these Identifiers, in table order, streamed in one read (inside batch(), in
        its transaction): what a maintenance plan may change and its undo puts back. One scan of the table (it has
        no index on Identifier)."""
        self._require_current()
        with self.reading() as raw:
            for values in raw.execute(f"{_SELECT} WHERE Identifier IN (SELECT value FROM json_each(?)) ORDER BY rowid",
                                      (json.dumps(sorted(set(identifiers))),)):
                yield KernelRow.from_values(tuple(values))

    def put_back(self, identifiers: Iterable[str], rows: Iterable[KernelRow]) -> int:
        """Make the rows of these Identifiers exactly `rows`, in that table order, in one transaction (an undo):
        their rows now are deleted, `rows` written as they are. Each op's order is the one given, not re-ranked:
        an undo restores what was, an op out of order included. The rows written."""
        names = json.dumps(sorted(set(identifiers)))

        def body(raw: sqlite3.Connection) -> int:
            raw.execute("DELETE FROM KernelCache WHERE Identifier IN (SELECT value FROM json_each(?))", (names,))
            written = 0
            for row in rows:
                raw.execute(_INSERT, row.values())
                self._known_ops.add(row.identifier)
                written += 1
            return written

        return self._write(body)

    # -- what the compiler sees ---------------------------------------------------------------

    def fetch_like_compiler(self, identifier: str, device_type: str) -> list[tuple[Any, ...]]:
        """(rowid, Key, OpType, Source, Tags, Miscs) of the rows NNFusion's fetch_all gets for this lookup, in
        the order it gets them: the same WHERE clause on the same table, so the same scan order."""
        self._require_current()
        return self.connection().execute(
            "SELECT rowid, Key, OpType, Source, Tags, Miscs FROM KernelCache WHERE (Identifier = ?) AND "
            "(DeviceType = ?)", (identifier, device_type)).fetchall()

    def device_types_of(self, identifier: str) -> dict[str, int]:
        """Rows of this identifier per DeviceType."""
        self._require_current()
        return dict(self.connection().execute(
            "SELECT DeviceType, count(*) FROM KernelCache WHERE Identifier = ? GROUP BY DeviceType",
            (identifier,)).fetchall())

    def identifiers_starting(self, prefix: str, device_type: str, limit: int = 5) -> list[str]:
        """Distinct identifiers under this DeviceType that start with `prefix` (same op and first shape)."""
        self._require_current()
        return [r[0] for r in self.connection().execute(
            "SELECT DISTINCT Identifier FROM KernelCache WHERE substr(Identifier, 1, ?) = ? AND DeviceType = ? "
            "LIMIT ?", (len(prefix), prefix, device_type, limit)).fetchall()]

    # -- the fused kernels' pairs ---------------------------------------------------------------

    def pair_problems(self) -> tuple[list[KernelRow], list[KernelRow]]:
        """(fused CUDA_GPU rows whose identifier has no CUDA row: never used by the compiler;
        fused CUDA rows whose identifier has no CUDA_GPU row: the compiler aborts on them)."""
        self._require_current()
        raw = self.connection()
        fused = ", ".join("?" * len(FUSED_OP_TYPES))
        rows = [KernelRow.from_values(tuple(r)) for r in
                raw.execute(f"{_SELECT} WHERE OpType IN ({fused})", FUSED_OP_TYPES).fetchall()]
        present = set(raw.execute(
            "SELECT DISTINCT Identifier, DeviceType FROM KernelCache WHERE DeviceType IN (?, ?) AND Identifier IN "
            f"(SELECT Identifier FROM KernelCache WHERE OpType IN ({fused}))",
            (DEVICE_TYPE, PATTERN_DEVICE_TYPE, *FUSED_OP_TYPES)).fetchall())
        unused = [r for r in rows
                  if r.device_type == DEVICE_TYPE and (r.identifier, PATTERN_DEVICE_TYPE) not in present]
        orphans = [r for r in rows
                   if r.device_type == PATTERN_DEVICE_TYPE and (r.identifier, DEVICE_TYPE) not in present]
        return unused, orphans

    def add_twins(self, keys: Sequence[str]) -> list[KernelRow]:
        """Write the CUDA twin of each fused CUDA_GPU row named, in one transaction; the twins written."""

        def body(raw: sqlite3.Connection) -> list[KernelRow]:
            written = []
            for key in keys:
                got = raw.execute(f"{_SELECT} WHERE Key = ?", (key,)).fetchone()
                if got is not None and self._sync_twin(raw, row := KernelRow.from_values(tuple(got))):
                    written.append(pattern_twin(row))
            return written

        return self._write(body)

    # -- reading ---------------------------------------------------------------------------

    def count(self, where: str = "", params: Sequence[Any] = ()) -> int:
        self._require_current()
        with self.reading() as conn:
            return conn.execute(f"SELECT count(*) FROM KernelCache {where}", tuple(params)).fetchone()[0]

    def _require_current(self) -> None:
        if self.schema is not Schema.CURRENT:
            raise DbError(f"{self.path} has no KernelCache table of the current schema "
                          f"(schema: {self.schema.value})")

    def find(self, key_or_identifier: str) -> list[KernelRow]:
        """Rows whose Key, or else Identifier, equals the text (or whose Key starts with it)."""
        self._require_current()
        cols = ", ".join(COLUMNS)
        with self.reading() as conn:
            rows = conn.execute(f"SELECT {cols} FROM KernelCache WHERE Key = ?", (key_or_identifier,)).fetchall()
            if not rows:
                rows = conn.execute(f"SELECT {cols} FROM KernelCache WHERE Identifier = ?",
                                    (key_or_identifier,)).fetchall()
            if not rows and len(key_or_identifier) >= 8:
                rows = conn.execute(
                    f"SELECT {cols} FROM KernelCache WHERE substr(Key, 1, ?) = ?",
                    (len(key_or_identifier), key_or_identifier),
                ).fetchall()
        return [KernelRow.from_values(tuple(r)) for r in rows]

    def iter_rows(self, where: str = "", params: Sequence[Any] = (), *, batch: int = 256) -> Iterator[KernelRow]:
        """Every row, streamed in Key order in short read transactions (memory flat in N)."""
        return self._paged("Key", where, params, batch)

    def iter_table_order(self, *, batch: int = 256) -> Iterator[KernelRow]:
        """Every row in table (rowid) order, streamed: NNFusion takes an identifier's FIRST row in this order,
        so a copy of a DB must keep it (iter_rows' Key order would hand the compiler other kernels)."""
        return self._paged("rowid", "", (), batch)

    def _paged(self, order: str, where: str, params: Sequence[Any], batch: int) -> Iterator[KernelRow]:
        """Rows by `order` (Key or rowid, both unique), `batch` at a time, each page in its own read."""
        self._require_current()
        cols = ", ".join(COLUMNS)
        cond = f"({where[len('WHERE '):]}) AND " if where.startswith("WHERE ") else ""
        last = None
        while True:
            with self.reading() as conn:
                if last is None:
                    got = conn.execute(f"SELECT {order}, {cols} FROM KernelCache {where} ORDER BY {order} LIMIT ?",
                                       (*params, batch)).fetchall()
                else:
                    got = conn.execute(f"SELECT {order}, {cols} FROM KernelCache WHERE {cond}{order} > ? "
                                       f"ORDER BY {order} LIMIT ?", (*params, last, batch)).fetchall()
            if not got:
                return
            for r in got:
                yield KernelRow.from_values(tuple(r[1:]))
            last = got[-1][0]

    def iter_raw(self) -> Iterator[tuple[Any, ...]]:
        """Rows exactly as stored (NULLs and non-text kept), for lint."""
        self._require_current()
        with self.reading() as conn:
            yield from conn.execute(
                "SELECT rowid, Key, Identifier, OpType, Attributes, Source, DeviceType, Function, Tags, Miscs "
                "FROM KernelCache ORDER BY rowid"
            )

    def iter_osdi20(self) -> Iterator[tuple[Any, ...]]:
        if self.schema is not Schema.OSDI20:
            raise DbError(f"{self.path} is not of the osdi20 schema")
        with self.reading() as conn:
            yield from conn.execute(
                "SELECT rowid, identifier, platform, function, tags, profile, resource FROM KernelCache "
                "ORDER BY rowid"
            )

    def tables(self) -> list[str]:
        with self.reading() as conn:
            return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]

    def integrity_check(self) -> list[str]:
        with self.reading() as conn:
            return [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]

    def backup_to_new_file(self, folder: Path, prefix: str) -> Path:
        """Back up into folder under a fresh time-stamped name (never over an earlier backup)."""
        return self.backup(new_db_file(folder, prefix))

    def backup(self, dest: Path) -> Path:
        """A consistent copy through SQLite's online backup API (never a file copy of a live DB)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        target = sqlite3.connect(str(dest))
        try:
            self.connection().backup(target)
        finally:
            target.close()
        return dest


def _rewrite_at_end(raw: sqlite3.Connection, key: str, values: tuple[Any, ...]) -> None:
    """Replace the row `key` by `values` under a rowid no row had: the browse index (core/db/summary_index.py) sees a
    changed row by its (rowid, Key) pair, and SQLite would give the table's last row its own rowid back."""
    (top,) = raw.execute("SELECT max(rowid) FROM KernelCache").fetchone()
    raw.execute("DELETE FROM KernelCache WHERE Key = ?", (key,))
    raw.execute(f"INSERT INTO KernelCache (rowid, {', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (top + 1, *values))


def new_db_file(folder: Path, prefix: str) -> Path:
    """A new empty file in folder under a fresh time-stamped name, claimed (two writers in one second must not
    share it)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        dest = folder / (f"{stem}.db" if n == 1 else f"{stem}-{n}.db")
        try:
            dest.open("x").close()
        except FileExistsError:
            continue
        return dest
    raise DbError(f"no free file name in {folder}")


def _osdi20_is_read_only(path: Path) -> DbError:
    return DbError(f"{path} uses the older osdi20 schema: it opens read-only; "
                   "`kdb db convert OLD NEW` rewrites it into the current schema")


def _detect_schema(conn: sqlite3.Connection) -> Schema:
    cols = [r[1] for r in conn.execute("PRAGMA table_info(KernelCache)")]
    if not cols:
        return Schema.EMPTY
    if tuple(cols) == COLUMNS:
        return Schema.CURRENT
    if tuple(c.lower() for c in cols) == OSDI20_COLUMNS:
        return Schema.OSDI20
    return Schema.UNKNOWN
