"""SQLite connections the way our files need them: WAL, a busy timeout, BEGIN IMMEDIATE for writers.

Plain sqlite3, no ORM: every command opens a DB, and SQLAlchemy's import alone took longer (0.3-0.5 s)
than a read command's whole budget.

Readers use deferred transactions so they never take a write lock; writers begin IMMEDIATE so two
writers queue on the busy timeout instead of dead-locking on a lock upgrade. A lock still held when
the busy timeout ends becomes DbLocked, a message naming the lock (never a bare "database is locked").
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.errors import DbError

DEFAULT_BUSY_TIMEOUT_S = 10.0
WAL_SIZE_LIMIT_BYTES = 64 * 2**20
BUSY_TIMEOUT_ENV = "KDB_BUSY_TIMEOUT_S"
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26


class DbLocked(DbError):
    """Another connection held the DB's lock for longer than the busy timeout."""


def busy_timeout() -> float:
    """How long to wait for another writer's lock: $KDB_BUSY_TIMEOUT_S, else 10 s."""
    text = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_BUSY_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise DbError(f"{BUSY_TIMEOUT_ENV}={text!r}: expected seconds between 0 and 3600")
    return value


def sqlite_uri(path: Path, *, readonly: bool) -> str:
    """The URI SQLite opens path by (odd characters percent-encoded); mode=ro never creates or writes the file."""
    return path.resolve().as_uri() + ("?mode=ro" if readonly else "")


def is_locked(exc: BaseException) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED (extended codes included)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF in (
        _SQLITE_BUSY, _SQLITE_LOCKED)


def locked_error(path: Path, timeout_s: float) -> DbLocked:
    return DbLocked(f"{path} is locked by another process: its lock was still held after the {timeout_s:g} s "
                    f"busy timeout (${BUSY_TIMEOUT_ENV} sets it); nothing was written, try again later")


def check_sqlite_file(path: Path) -> None:
    """Refuse what is not an SQLite database (empty or missing is fine), through a read-only SQLite connection.

    Never with open(): closing any descriptor of a file drops every POSIX lock this process holds on it, those
    of its live SQLite connections included; another process may then checkpoint and delete the WAL under
    them (their reads fail with "database disk image is malformed", their commits can be lost).
    """
    try:
        if path.is_symlink() and not path.exists():
            raise DbError(f"{path} is a dangling symbolic link")
        if not path.exists():
            return
        if not path.is_file():
            raise DbError(f"{path} is not a regular file")
        size = path.stat().st_size
        if size == 0:
            return
        if size < 512:  # SQLite itself takes a file of a few bytes for an empty DB, and would write over it
            raise DbError(f"{path} is not an SQLite database ({size} bytes: smaller than one SQLite page)")
    except OSError as exc:
        raise DbError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        conn = sqlite3.connect(sqlite_uri(path, readonly=True), uri=True, timeout=0)
        try:
            conn.execute("PRAGMA schema_version").fetchone()  # reads the header and the first page
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if is_locked(exc):
            return  # a lock says nothing of the format; the caller's own open waits for it
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if code == _SQLITE_NOTADB:
            raise DbError(f"{path} is not an SQLite database ({exc})") from exc
        if code == _SQLITE_CORRUPT:
            raise damaged(path, str(exc)) from exc
        raise DbError(f"cannot read {path}: {exc}") from exc


def quick_check(path: Path, timeout_s: float | None = None) -> None:
    """Refuse a DB damaged inside before anything writes to it: PRAGMA quick_check on a read-only connection.

    O(size) but cheap (no index cross-checks); the header alone (check_sqlite_file) misses damaged pages.
    """
    timeout_s = busy_timeout() if timeout_s is None else timeout_s
    try:
        conn = sqlite3.connect(sqlite_uri(path, readonly=True), uri=True, timeout=timeout_s)
        try:
            problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check(1)")]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if is_locked(exc):
            raise locked_error(path, timeout_s) from exc
        raise damaged(path, str(exc)) from exc
    if problems != ["ok"]:
        raise damaged(path, "; ".join(problems))


def damaged(path: Path, detail: str) -> DbError:
    return DbError(f"{path} is damaged: {detail} (restore a backup; `kdb db check` tells more)")


def connect(path: Path, *, readonly: bool, busy_timeout_s: float | None = None) -> sqlite3.Connection:
    """A connection to one SQLite file, in autocommit mode: transactions are explicit (see transaction()).

    Read-only connections open with mode=ro and never create the file; writers switch it to WAL.
    busy_timeout_s: how long to wait for another connection's lock (default: busy_timeout()).
    """
    timeout_s = busy_timeout() if busy_timeout_s is None else busy_timeout_s
    uri = sqlite_uri(path, readonly=readonly)
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=timeout_s, check_same_thread=False, isolation_level=None)
    except sqlite3.Error as exc:
        raise DbError(f"cannot open {path}: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        if not readonly:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()  # a non-database fails here
            if mode and str(mode[0]).lower() != "wal":
                raise DbError(f"{path}: cannot switch to WAL mode (journal_mode={mode[0]})")
            conn.execute("PRAGMA synchronous = NORMAL")
            # Readers that keep overlapping let the WAL grow as large as the DB; cut it back whenever a
            # checkpoint gets to restart it (the file is reused, not shrunk, without this).
            conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection, path: Path, *, write: bool) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT for writers, a deferred BEGIN for readers; ROLLBACK on any error.

    A lock still held when the busy timeout ends becomes DbLocked naming the file.
    """
    try:
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        if is_locked(exc):
            raise locked_error(path, busy_timeout()) from exc
        raise
