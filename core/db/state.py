"""The console's own state (runs, failed conversions), in a file of its own: never in the NNFusion DB.

Default location: the user data dir (`KDB_STATE_DIR` overrides it). Each failure keeps the input
item it came from, so it can be retried after a fix (a new SM arch, an edited item).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Field, Session, SQLModel, col, select

from core.db.engine import check_sqlite_file, make_engine
from core.errors import printable

MAX_KEPT_INPUT = 8 * 1024 * 1024  # larger inputs are kept by path only


def state_dir() -> Path:
    env = os.environ.get("KDB_STATE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("kdb", appauthor=False))


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Run(SQLModel, table=True):
    __tablename__ = "run"
    id: int | None = Field(default=None, primary_key=True)
    kind: str  # inject, retry, codegen, tune
    db_path: str
    started_at: str = Field(default_factory=now)
    finished_at: str | None = None
    args: str = "{}"
    injected: int = 0
    unchanged: int = 0
    failed: int = 0
    cancelled: bool = False


class Failure(SQLModel, table=True):
    __tablename__ = "failure"
    id: int | None = Field(default=None, primary_key=True)
    run_id: int | None = Field(default=None, index=True)
    db_path: str = Field(index=True)
    file: str
    item_index: int | None = None  # None: the whole file failed
    name: str = ""
    stage: str  # read, validate, parse, barriers, compile, insert, ...
    reason: str
    detail: str = "{}"  # JSON: field, line, tool output...
    input: str | None = None  # the raw item JSON, for retry
    created_at: str = Field(default_factory=now)
    resolved_at: str | None = None  # set when a retry succeeded
    dismissed: bool = False

    def detail_dict(self) -> dict[str, Any]:
        try:
            value = json.loads(self.detail)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def as_report(self) -> dict[str, Any]:
        return {"file": self.file, "index": self.item_index, "name": self.name, "stage": self.stage,
                "reason": self.reason}


class StateDB:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / "state.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        check_sqlite_file(self.path)
        self.engine: Engine = make_engine(self.path, readonly=False)
        SQLModel.metadata.create_all(self.engine, tables=[Run.__table__, Failure.__table__])  # type: ignore[attr-defined]

    def close(self) -> None:
        self.engine.dispose()

    def start_run(self, kind: str, db_path: Path, args: dict[str, Any]) -> int:
        with Session(self.engine) as s:
            run = Run(kind=kind, db_path=str(db_path), args=json.dumps(args))
            s.add(run)
            s.commit()
            assert run.id is not None
            return run.id

    def finish_run(self, run_id: int, *, injected: int, unchanged: int, failed: int, cancelled: bool) -> None:
        with Session(self.engine) as s:
            run = s.get(Run, run_id)
            if run is None:
                return
            run.finished_at = now()
            run.injected, run.unchanged, run.failed, run.cancelled = injected, unchanged, failed, cancelled
            s.add(run)
            s.commit()

    def record_failures(self, failures: Sequence[Failure]) -> None:
        if not failures:
            return
        with Session(self.engine) as s:
            for f in failures:
                if f.input is not None and len(f.input) > MAX_KEPT_INPUT:
                    f.input = None
                # File names and reasons may carry undecodable bytes: store them escaped, never fail.
                f.file, f.name, f.reason = printable(f.file), printable(f.name), printable(f.reason)
                f.detail = printable(f.detail)
                s.add(f)
            s.commit()

    def failures(self, db_path: Path | None = None, *, include_closed: bool = False) -> list[Failure]:
        with Session(self.engine) as s:
            q = select(Failure)
            if db_path is not None:
                q = q.where(Failure.db_path == str(db_path))
            if not include_closed:
                q = q.where(col(Failure.dismissed).is_(False), col(Failure.resolved_at).is_(None))
            return list(s.exec(q.order_by(col(Failure.id))))

    def get_failure(self, failure_id: int) -> Failure | None:
        with Session(self.engine) as s:
            return s.get(Failure, failure_id)

    def close_failures(self, ids: Sequence[int], *, resolved: bool) -> None:
        with Session(self.engine) as s:
            for fid in ids:
                f = s.get(Failure, fid)
                if f is None:
                    continue
                if resolved:
                    f.resolved_at = now()
                else:
                    f.dismissed = True
                s.add(f)
            s.commit()

    def update_input(self, failure_id: int, text: str) -> None:
        with Session(self.engine) as s:
            f = s.get(Failure, failure_id)
            if f is not None:
                f.input = text
                s.add(f)
                s.commit()

    def runs(self, limit: int = 50) -> list[Run]:
        with Session(self.engine) as s:
            return list(s.exec(select(Run).order_by(col(Run.id).desc()).limit(limit)))
