"""The console's own state (runs, failed conversions), in a file of its own: never in the NNFusion DB.

Default location: the user data dir (`KDB_STATE_DIR` overrides it). Each failure keeps the input
item it came from, so it can be retried after a fix (a new SM arch, an edited item).

The dataclasses Run, Failure and ModelEvent are the file's schema, declared once: their fields are the tables' columns
(create_table_sql), in the layout SQLModel's create_all gave the first state files (tests/test_state_db.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from core.db.engine import check_sqlite_file, connect, transaction
from core.errors import printable

MAX_KEPT_INPUT = 8 * 1024 * 1024  # larger inputs are kept by path only


def state_dir() -> Path:
    env = os.environ.get("KDB_STATE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("kdb", appauthor=False))


def _json_object(text: str) -> dict[str, Any]:
    """A detail column's JSON object ({} when it holds anything else)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# A column's SQL type by its field's annotation; "| None" makes it nullable.
SQL_TYPES = {"int": "INTEGER", "str": "VARCHAR", "bool": "BOOLEAN"}
INDEXED = {"index": True}  # a field's metadata: the column gets an index (ix_<table>_<column>)


@dataclass(kw_only=True)
class Run:
    TABLE: ClassVar[str] = "run"

    id: int | None = None
    kind: str  # inject, retry, codegen, tune, nnfusion
    db_path: str
    started_at: str = field(default_factory=now)
    finished_at: str | None = None
    args: str = "{}"
    injected: int = 0
    unchanged: int = 0
    failed: int = 0
    cancelled: bool = False


@dataclass(kw_only=True)
class Failure:
    TABLE: ClassVar[str] = "failure"

    id: int | None = None
    run_id: int | None = field(default=None, metadata=INDEXED)
    db_path: str = field(metadata=INDEXED)
    file: str
    item_index: int | None = None  # None: the whole file failed
    name: str = ""
    stage: str  # read, validate, parse, barriers, compile, insert, ...
    reason: str
    detail: str = "{}"  # JSON: field, line, tool output...
    input: str | None = None  # the raw item JSON, for retry
    created_at: str = field(default_factory=now)
    resolved_at: str | None = None  # set when a retry succeeded
    dismissed: bool = False

    def detail_dict(self) -> dict[str, Any]:
        return _json_object(self.detail)

    def as_report(self) -> dict[str, Any]:
        return {"file": self.file, "index": self.item_index, "name": self.name, "stage": self.stage,
                "reason": self.reason}


@dataclass(kw_only=True)
class ModelEvent:
    """One step of a model's story with a DB, as the core use case that took it wrote it (both faces alike): a compile,
    a run against the empty DB, the op times, the never-slower step, or the model opened in the console."""

    TABLE: ClassVar[str] = "model_event"

    id: int | None = None
    model: str = field(metadata=INDEXED)  # the model file, resolved
    db_path: str
    kind: str  # one of MODEL_EVENT_KINDS
    ok: bool  # a clean compile; right and not slower; every op timed, none slower; ...
    headline: str  # the outcome in one line, as the faces say it
    detail: str = "{}"  # JSON: the figures behind the headline
    created_at: str = field(default_factory=now)

    def detail_dict(self) -> dict[str, Any]:
        return _json_object(self.detail)


MODEL_EVENT_KINDS = ("compile", "run", "op-times", "never-slower", "opened")
RECORDS: tuple[type[Run | Failure | ModelEvent], ...] = (Run, Failure, ModelEvent)
Record = TypeVar("Record", Run, Failure, ModelEvent)


def create_table_sql(cls: type[Run | Failure | ModelEvent]) -> list[str]:
    """CREATE TABLE and CREATE INDEX statements for a record class (IF NOT EXISTS: two commands may create a new
    state file at once). `id` is the primary key; no defaults in SQL: every insert names its values."""
    columns = []
    for f in fields(cls):
        base, _, optional = str(f.type).partition(" | ")
        if base not in SQL_TYPES or optional not in ("", "None"):
            raise TypeError(f"{cls.__name__}.{f.name}: {f.type} has no SQL column type")
        columns.append(f"{f.name} {SQL_TYPES[base]}{'' if optional and f.name != 'id' else ' NOT NULL'}")
    statements = [f"CREATE TABLE IF NOT EXISTS {cls.TABLE} (\n\t" + ", \n\t".join(columns)
                  + ", \n\tPRIMARY KEY (id)\n)"]
    statements += [f"CREATE INDEX IF NOT EXISTS ix_{cls.TABLE}_{f.name} ON {cls.TABLE} ({f.name})"
                   for f in sorted(fields(cls), key=lambda f: f.name) if f.metadata.get("index")]
    return statements


class StateDB:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / "state.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        check_sqlite_file(self.path)
        self.conn = connect(self.path, readonly=False)
        try:
            self._create_tables()
        except BaseException:
            self.conn.close()
            raise

    def _create_tables(self) -> None:
        # Looked for first: most opens find them, and a reader need not take the write lock.
        tables = [cls.TABLE for cls in RECORDS]
        found = self.conn.execute(f"SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                                  f"({', '.join('?' * len(tables))})", tables).fetchone()[0]
        if found < len(tables):  # a new file, or one from before a table was added
            with self._transaction() as conn:
                for cls in RECORDS:
                    for statement in create_table_sql(cls):
                        conn.execute(statement)

    def close(self) -> None:
        self.conn.close()

    def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self.conn, self.path, write=True)

    def _select(self, cls: type[Record], where: str = "", params: Sequence[Any] = ()) -> list[Record]:
        names = [f.name for f in fields(cls)]
        with transaction(self.conn, self.path, write=False) as conn:
            got = conn.execute(f"SELECT {', '.join(names)} FROM {cls.TABLE} {where}", tuple(params)).fetchall()
        bools = {f.name for f in fields(cls) if f.type == "bool"}
        return [cls(**{n: bool(v) if n in bools else v for n, v in zip(names, r, strict=True)}) for r in got]

    @staticmethod
    def _insert(conn: sqlite3.Connection, record: Run | Failure | ModelEvent) -> int:
        names = [f.name for f in fields(record) if f.name != "id"]  # SQLite numbers the rows
        values = tuple(getattr(record, n) for n in names)
        cursor = conn.execute(f"INSERT INTO {record.TABLE} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                              values)
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def start_run(self, kind: str, db_path: Path, args: dict[str, Any]) -> int:
        with self._transaction() as conn:
            return self._insert(conn, Run(kind=kind, db_path=str(db_path), args=json.dumps(args)))

    def finish_run(self, run_id: int, *, injected: int, unchanged: int, failed: int, cancelled: bool) -> None:
        with self._transaction() as conn:
            conn.execute("UPDATE run SET finished_at = ?, injected = ?, unchanged = ?, failed = ?, cancelled = ? "
                         "WHERE id = ?", (now(), injected, unchanged, failed, cancelled, run_id))

    def record_failures(self, failures: Sequence[Failure]) -> None:
        if not failures:
            return
        with self._transaction() as conn:
            for f in failures:
                if f.input is not None and len(f.input) > MAX_KEPT_INPUT:
                    f.input = None
                # File names and reasons may carry undecodable bytes: store them escaped, never fail.
                f.file, f.name, f.reason = printable(f.file), printable(f.name), printable(f.reason)
                f.detail = printable(f.detail)
                f.id = self._insert(conn, f)

    def failures(self, db_path: Path | None = None, *, include_closed: bool = False) -> list[Failure]:
        clauses, params = [], []
        if db_path is not None:
            clauses.append("db_path = ?")
            params.append(str(db_path))
        if not include_closed:
            clauses.append("NOT dismissed AND resolved_at IS NULL")
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        return self._select(Failure, f"{where} ORDER BY id", params)

    def get_failure(self, failure_id: int) -> Failure | None:
        got = self._select(Failure, "WHERE id = ?", (failure_id,))
        return got[0] if got else None

    def close_failures(self, ids: Sequence[int], *, resolved: bool) -> None:
        column, value = ("resolved_at", now()) if resolved else ("dismissed", True)
        with self._transaction() as conn:
            conn.executemany(f"UPDATE failure SET {column} = ? WHERE id = ?", [(value, fid) for fid in ids])

    def update_input(self, failure_id: int, text: str) -> None:
        with self._transaction() as conn:
            conn.execute("UPDATE failure SET input = ? WHERE id = ?", (text, failure_id))

    def retarget_failures(self, old_db: Path, new_db: Path) -> None:
        """Failures recorded against a DB file that has since been renamed follow it."""
        with self._transaction() as conn:
            conn.execute("UPDATE failure SET db_path = ? WHERE db_path = ?", (str(new_db), str(old_db)))

    def runs(self, limit: int = 50) -> list[Run]:
        return self._select(Run, "ORDER BY id DESC LIMIT ?", (limit,))

    # -- a model's story (the console's Network view) ------------------------------------------------------------

    def record_model_event(self, event: ModelEvent) -> None:
        event.model, event.headline, event.detail = printable(event.model), printable(event.headline), \
            printable(event.detail)
        with self._transaction() as conn:
            event.id = self._insert(conn, event)

    def model_events(self, model: Path, db_path: Path | None = None, limit: int = 20) -> list[ModelEvent]:
        """The model's events, newest first (with `db_path`: with that DB only)."""
        where, params = "WHERE model = ?", [str(model)]
        if db_path is not None:
            where += " AND db_path = ?"
            params.append(str(db_path))
        return self._select(ModelEvent, f"{where} ORDER BY id DESC LIMIT ?", (*params, limit))

    def recent_models(self, limit: int = 10) -> list[str]:
        """The models of the latest events, newest first, each once."""
        with transaction(self.conn, self.path, write=False) as conn:
            return [r[0] for r in conn.execute("SELECT model FROM model_event GROUP BY model ORDER BY max(id) DESC "
                                               "LIMIT ?", (limit,))]
