"""SQLite engines the way both of our files need them: WAL, a busy timeout, BEGIN IMMEDIATE for writers.

Readers use deferred transactions so they never take a write lock; writers begin IMMEDIATE so two
writers queue on the busy timeout instead of dead-locking on a lock upgrade.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.request import pathname2url

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import NullPool

from core.errors import DbError

SQLITE_MAGIC = b"SQLite format 3\x00"
DEFAULT_BUSY_TIMEOUT_S = 10.0


def check_sqlite_file(path: Path) -> None:
    """Refuse what is not an SQLite database before SQLite touches it (empty or missing is fine)."""
    try:
        if path.is_symlink() and not path.exists():
            raise DbError(f"{path} is a dangling symbolic link")
        if not path.exists():
            return
        if not path.is_file():
            raise DbError(f"{path} is not a regular file")
        with path.open("rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise DbError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not header:
        return
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise DbError(f"{path} is not an SQLite database (no SQLite header)")
    page_size = int.from_bytes(header[16:18], "big")
    if page_size == 1:
        page_size = 65536
    if page_size < 512 or page_size & (page_size - 1):
        raise DbError(f"{path} has a corrupt SQLite header (page size {page_size})")


def make_engine(path: Path, *, readonly: bool, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Engine:
    """An engine on one SQLite file. Read-only engines open with mode=ro and never create the file."""

    def connect() -> sqlite3.Connection:
        uri = f"file:{pathname2url(str(path.resolve()))}" + ("?mode=ro" if readonly else "")
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, check_same_thread=False,
                                   isolation_level=None)
        except sqlite3.Error as exc:
            raise DbError(f"cannot open {path}: {exc}") from exc
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        if not readonly:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode and str(mode[0]).lower() != "wal":
                conn.close()
                raise DbError(f"{path}: cannot switch to WAL mode (journal_mode={mode[0]})")
            conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    engine = create_engine("sqlite://", creator=connect, poolclass=NullPool if readonly else None)

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine
