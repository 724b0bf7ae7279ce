"""The console's own state (runs, failed conversions, models' stories), in a file of its own: never in the NNFusion
DB.

Default location: the user data dir (`KDB_STATE_DIR` overrides it). Each failure keeps the input
item it came from, so it can be retried after a fix (a new SM arch, an edited item).

The schema is declared once, with SQLModel (core/db/state_records.py: Run, Failure, ModelEvent). StateDB keeps its
own sqlite3 connection (core/db/engine.py: WAL, a busy timeout, BEGIN IMMEDIATE for writers), as every kdb file does.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from core.db.engine import check_sqlite_file, connect, transaction
from core.db.record_facts import FailureFacts, WithDetail, now
from core.errors import printable

if TYPE_CHECKING:
    from core.db.state_records import Failure, ModelEvent, Run


S = TypeVar("S")  # a Stored* class (to a type checker: its schema class)

MAX_KEPT_INPUT = 8 * 1024 * 1024  # larger inputs are kept by path only


def db_key(db_path: Path | str) -> str:
    """A kernel DB as the state file names it: its absolute path, so that `--db k.db` in two folders are two DBs
    and the same file given relative or absolute is one."""
    return str(Path(db_path).expanduser().absolute())


def state_dir() -> Path:
    env = os.environ.get("KDB_STATE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("kdb", appauthor=False))


class Stored:
    """A record as the state file gives it back: its columns as attributes (SELECT *: nothing here repeats the
    schema), BOOLEAN columns as bools. Reading needs no SQLModel, so `kdb failures` stays a light command."""

    def __init__(self, **columns: Any) -> None:
        self.__dict__.update(columns)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def replace(self, **changes: Any) -> Any:
        return type(self)(**{**vars(self), **changes})


if TYPE_CHECKING:  # to a type checker a record read back is the schema's class: the same columns, the same helpers
    StoredRun, StoredFailure, StoredModelEvent = Run, Failure, ModelEvent
else:
    class StoredRun(Stored):
        pass

    class StoredFailure(Stored, FailureFacts):
        pass

    class StoredModelEvent(Stored, WithDetail):
        pass


MODEL_EVENT_KINDS = ("compile", "run", "op-times", "never-slower", "opened")
_RECORD_NAMES = ("Run", "Failure", "ModelEvent")


def __getattr__(name: str) -> Any:
    """Run, Failure and ModelEvent are SQLModel tables (core/db/state_records.py), loaded on first use only: read
    commands and the console's first paint import this module for state_dir and never pay SQLModel's import."""
    if name in _RECORD_NAMES:
        from core.db import state_records

        return getattr(state_records, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        # Looked for first: most opens find them, and a reader need not take the write lock (nor load SQLModel).
        tables = ["run", "failure", "model_event"]
        found = self.conn.execute(f"SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                                  f"({', '.join('?' * len(tables))})", tables).fetchone()[0]
        if found < len(tables):  # a new file, or one from before a table was added
            from core.db.state_records import RECORDS, create_table_sql

            with self._transaction() as conn:
                for cls in RECORDS:
                    for statement in create_table_sql(cls):
                        conn.execute(statement)

    def close(self) -> None:
        self.conn.close()

    def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self.conn, self.path, write=True)

    def _select(self, cls: type[S], table: str, where: str = "", params: Sequence[Any] = ()) -> list[S]:
        with transaction(self.conn, self.path, write=False) as conn:
            cursor = conn.execute(f"SELECT * FROM {table} {where}", tuple(params))
            names = [d[0] for d in cursor.description]
            got = cursor.fetchall()
            bools = {c[1] for c in conn.execute(f"PRAGMA table_info({table})") if c[2].upper() == "BOOLEAN"}
        return [cls(**{n: bool(v) if n in bools else v for n, v in zip(names, r, strict=True)}) for r in got]

    @staticmethod
    def _insert(conn: sqlite3.Connection, record: Run | Failure | ModelEvent) -> int:
        names = [n for n in type(record).model_fields if n != "id"]  # SQLite numbers the rows
        values = tuple(getattr(record, n) for n in names)
        cursor = conn.execute(f"INSERT INTO {record.__tablename__} ({', '.join(names)}) "
                              f"VALUES ({', '.join('?' * len(names))})", values)
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def start_run(self, kind: str, db_path: Path, args: dict[str, Any]) -> int:
        from core.db.state_records import Run

        with self._transaction() as conn:
            return self._insert(conn, Run(kind=kind, db_path=db_key(db_path), args=json.dumps(args)))

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
                f.db_path = db_key(f.db_path)
                f.detail = printable(f.detail)
                f.id = self._insert(conn, f)

    def failures(self, db_path: Path | None = None, *, include_closed: bool = False) -> list[StoredFailure]:
        clauses, params = [], []
        if db_path is not None:  # (as recorded before db_key: the path as typed)
            clauses.append("db_path IN (?, ?)")
            params += [db_key(db_path), str(db_path)]
        if not include_closed:
            clauses.append("NOT dismissed AND resolved_at IS NULL")
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        return self._select(StoredFailure, "failure", f"{where} ORDER BY id", params)

    def get_failure(self, failure_id: int) -> StoredFailure | None:
        got = self._select(StoredFailure, "failure", "WHERE id = ?", (failure_id,))
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
            conn.execute("UPDATE failure SET db_path = ? WHERE db_path IN (?, ?)",
                         (db_key(new_db), db_key(old_db), str(old_db)))

    def runs(self, limit: int = 50) -> list[StoredRun]:
        return self._select(StoredRun, "run", "ORDER BY id DESC LIMIT ?", (limit,))

    # -- a model's story (the console's Network view) ------------------------------------------------------------

    def record_model_event(self, event: ModelEvent) -> None:
        event.model, event.headline, event.detail = printable(event.model), printable(event.headline), \
            printable(event.detail)
        event.db_path = db_key(event.db_path)
        with self._transaction() as conn:
            event.id = self._insert(conn, event)

    def model_events(self, model: Path, db_path: Path | None = None, limit: int = 20) -> list[StoredModelEvent]:
        """The model's events, newest first (with `db_path`: with that DB only)."""
        where, params = "WHERE model = ?", [str(model)]
        if db_path is not None:
            where += " AND db_path IN (?, ?)"
            params += [db_key(db_path), str(db_path)]
        return self._select(StoredModelEvent, "model_event", f"{where} ORDER BY id DESC LIMIT ?", (*params, limit))

    def recent_models(self, limit: int = 10) -> list[str]:
        """The models of the latest events, newest first, each once."""
        with transaction(self.conn, self.path, write=False) as conn:
            return [r[0] for r in conn.execute("SELECT model FROM model_event GROUP BY model ORDER BY max(id) DESC "
                                               "LIMIT ?", (limit,))]
