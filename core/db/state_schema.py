"""The state file's schema, declared once with SQLModel; it creates the tables of a new state file.

Only that first creation imports SQLModel (and SQLAlchemy under it: about half a second). Every other use of
the state file reads and writes these tables through sqlite3 (core/db/state.py), so no command pays for the
import at start. tests/test_state_db.py holds the dataclasses there to these columns.
"""

from __future__ import annotations

from pathlib import Path

from sqlmodel import Field, SQLModel, create_engine

from core.processes import file_lock


class RunTable(SQLModel, table=True):
    __tablename__ = "run"
    id: int | None = Field(default=None, primary_key=True)
    kind: str  # inject, retry, codegen, tune, nnfusion
    db_path: str
    started_at: str
    finished_at: str | None = None
    args: str = "{}"
    injected: int = 0
    unchanged: int = 0
    failed: int = 0
    cancelled: bool = False


class FailureTable(SQLModel, table=True):
    __tablename__ = "failure"
    id: int | None = Field(default=None, primary_key=True)
    run_id: int | None = Field(default=None, index=True)
    db_path: str = Field(index=True)
    file: str
    item_index: int | None = None
    name: str = ""
    stage: str
    reason: str
    detail: str = "{}"
    input: str | None = None
    created_at: str
    resolved_at: str | None = None
    dismissed: bool = False


def creation_lock(path: Path) -> Path:
    return path.with_name(path.name + ".create-lock")


def create_tables(path: Path) -> None:
    """Create the tables (and indexes) a state file needs; existing ones are left as they are.

    Under a cross-process lock: SQLAlchemy looks for each table, then creates it, and two commands started
    together on a new state dir (two `kdb inject` in CI) both found none and one died on "table run already
    exists". The second now waits, then finds the first one's tables."""
    with file_lock(creation_lock(path)):
        engine = create_engine(f"sqlite:///{path}")
        try:
            SQLModel.metadata.create_all(engine, tables=[RunTable.__table__, FailureTable.__table__])
        finally:
            engine.dispose()
