"""The state file's schema, declared once, with SQLModel: each class is a table, its fields the columns (types,
NOT NULL unless `| None`, `index=True` for an index ix_<table>_<column>), in the layout SQLModel's create_all gave
the first state files (tests/test_state_db.py).

Only what writes or reads records imports this module (core.db.state loads it on first use): SQLModel takes about
half a second to import, and `kdb ls`, `kdb show` and the console's first paint never touch a record.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import sqlite
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlmodel import Field, SQLModel

from core.db.record_facts import FailureFacts, WithDetail, now


class Run(SQLModel, table=True):
    __tablename__ = "run"

    id: int | None = Field(default=None, primary_key=True)
    kind: str  # inject, retry, codegen, tune, nnfusion
    db_path: str
    started_at: str = Field(default_factory=now)
    finished_at: str | None = None
    args: str = "{}"
    injected: int = 0
    unchanged: int = 0
    failed: int = 0
    cancelled: bool = False


class Failure(FailureFacts, SQLModel, table=True):
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


class ModelEvent(WithDetail, SQLModel, table=True):
    """One step of a model's story with a DB, as the core use case that took it wrote it (both faces alike): a compile,
    a run against the empty DB, the op times, the never-slower step, or the model opened in the console."""

    __tablename__ = "model_event"

    id: int | None = Field(default=None, primary_key=True)
    model: str = Field(index=True)  # the model file, resolved
    db_path: str
    kind: str  # one of MODEL_EVENT_KINDS
    ok: bool  # a clean compile; right and not slower; every op timed, none slower; ...
    headline: str  # the outcome in one line, as the faces say it
    detail: str = "{}"  # JSON: the figures behind the headline
    created_at: str = Field(default_factory=now)


RECORDS: tuple[type[Run | Failure | ModelEvent], ...] = (Run, Failure, ModelEvent)


def columns(cls: type[SQLModel]) -> list[str]:
    """The table's columns in order (its fields')."""
    return list(cls.model_fields)


def create_table_sql(cls: type[SQLModel]) -> list[str]:
    """CREATE TABLE and CREATE INDEX statements for a record class, as SQLAlchemy writes them for SQLite (IF NOT
    EXISTS: two commands may create a new state file at once; SQLite stores them without it)."""
    table: Any = cls.__table__  # type: ignore[attr-defined]
    dialect = sqlite.dialect()
    statements = [str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)).strip()]
    statements += [str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)).strip()
                   for index in sorted(table.indexes, key=lambda i: i.name)]
    return statements
