"""A maintenance plan's changes to the kernel DB, as data (DbEdit); applied in one transaction, undone exactly.

Backup or undo? Both faces keep an undo file and no whole-DB backup. Before anything changes, `apply_edit` writes
every row of the ops the edit touches, as they are and in their table order, into a file of NNFusion's own format
(the state dir's `undo/`), inside the same write transaction: the file and the change both happen or neither does.
`undo_edit` puts exactly those rows back (a deleted row, a rewritten one, a twin added, an op reordered). A copy of
the whole DB before each plan would cost its size (a million rows: gigabytes) to restore a few ops, and the console
could not offer it as `u`; `kdb db backup` still makes one on request.

Both sides are checked, so a change never lands on a DB other than the one previewed: `apply_edit` refuses when the
ops' rows are no longer those the plan read (its fingerprint), and `undo_edit` when they are no longer those the
apply left (another write came between: undoing would silently lose it).

Rows are streamed, never held: into the undo file, out of it, through the fingerprints (a DB of a million rows
whose ops all change costs the undo file's size on disk, not in memory).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.db.kernel_db import KernelDB, new_db_file
from core.db.state import state_dir
from core.errors import DbError, InputError
from core.kernels.kernel_row import KernelRow

UNDO_TABLE = "kdb_undo"  # beside KernelCache in an undo file: which DB, which ops, the states before and after
UNDO_FORMAT = 1


@dataclass(frozen=True)
class DbEdit:
    """What a plan writes. `ops`: the Identifiers whose rows it may change (their rows are what undo restores)."""

    ops: tuple[str, ...]
    delete: tuple[str, ...] = ()  # Keys (a fused kernel's CUDA twin goes with its row)
    rewrite: tuple[tuple[str, Mapping[str, str]], ...] = ()  # (Key, {column: new text}); a twin follows its row
    add_twins: tuple[str, ...] = ()  # fused CUDA_GPU rows whose CUDA twin is written
    reorder: tuple[str, ...] = ()  # Identifiers whose CUDA_GPU rows are put fastest-first
    put_back: Path | None = None  # an undo: the ops' rows become exactly those of this undo file
    insert_from: Path | None = None  # a set-aside file of old: its rows go back, Keys the DB has left alone

    @property
    def empty(self) -> bool:
        return not (self.delete or self.rewrite or self.add_twins or self.reorder) \
            and self.put_back is None and self.insert_from is None


@dataclass
class Applied:
    undo_file: Path | None  # None: nothing was written
    deleted: list[str] = field(default_factory=list)  # Keys (a fused kernel's twin with its row)
    rewritten: list[str] = field(default_factory=list)
    twins: list[KernelRow] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    written: int = 0  # rows a put_back or insert wrote


@dataclass(frozen=True)
class UndoRecord:
    """An undo file read back (its rows stay in it: iter_undo_rows streams them)."""

    path: Path
    verb: str  # the plan it undoes
    db: str  # the DB it was applied to ("" in a set-aside file of old, which names none)
    ops: tuple[str, ...]
    before: str  # fingerprint of the ops' rows before the apply (the file's rows)
    after: str  # fingerprint of the ops' rows the apply left ("" in a set-aside file of old)


class Fingerprint:
    """Each op's rows (Identifier, DeviceType), every column, in their table order, in a few bytes: what NNFusion
    reads. Equal fingerprints, equal rows; where one op's rows stand among another's does not count (a rewrite moves
    a row to the table's end without changing what the compiler sees)."""

    def __init__(self) -> None:
        self._ops: dict[tuple[str, str], Any] = {}

    def add(self, row: KernelRow) -> KernelRow:
        op = (row.identifier, row.device_type)
        hasher = self._ops.get(op)
        if hasher is None:
            hasher = self._ops[op] = hashlib.sha256()
        hasher.update(row_digest(row).encode())
        return row

    def hexdigest(self) -> str:
        return hashlib.sha256(json.dumps([(op, h.hexdigest()) for op, h in sorted(self._ops.items())],
                                         ensure_ascii=False).encode()).hexdigest()


def fingerprint(rows: Iterable[KernelRow]) -> str:
    summary = Fingerprint()
    for row in rows:
        summary.add(row)
    return summary.hexdigest()


def row_digest(row: KernelRow) -> str:
    """One row, every column."""
    return hashlib.sha256(json.dumps(row.values(), ensure_ascii=False).encode()).hexdigest()


def apply_edit(db: KernelDB, edit: DbEdit, *, verb: str, expected: str, undo_dir: Path | None = None) -> Applied:
    """Write `edit` in one transaction, the undo file first (inside it); `expected`: the fingerprint of the ops'
    rows the plan was made from (DbError, nothing written, when the DB has moved on since)."""
    if edit.empty:
        return Applied(None)
    undo_file: Path | None = None
    try:
        with db.batch():
            undo_file = new_db_file(undo_dir or state_dir() / "undo", f"undo-{verb}")
            before = Fingerprint()
            with KernelDB.open(undo_file, create=True) as undo:  # the ops' rows as they are, in their order
                undo.put_back((), (before.add(row) for row in db.iter_op_rows(edit.ops)))
            if before.hexdigest() != expected:
                raise DbError(f"{db.path}: the rows of the {len(edit.ops)} op(s) this plan changes are no longer "
                              "those it was made from (another write came between): nothing written; make the "
                              "plan again")
            applied = Applied(None)
            if edit.put_back is not None:
                applied.written = db.put_back(edit.ops, iter_undo_rows(edit.put_back))
            if edit.insert_from is not None:
                applied.written += db.restore(iter_undo_rows(edit.insert_from))
            applied.moved = db.put_in_order(edit.reorder) if edit.reorder else []
            applied.deleted = list(db.delete(edit.delete, keep_rows=False).rowids) if edit.delete else []
            if edit.rewrite:
                db.update_rows(edit.rewrite)
                applied.rewritten = [key for key, _ in edit.rewrite]
            applied.twins = db.add_twins(edit.add_twins) if edit.add_twins else []
            _write_undo_meta(undo_file, verb, db.path, edit.ops, before.hexdigest(),
                             fingerprint(db.iter_op_rows(edit.ops)))
            applied.undo_file = undo_file
    except BaseException:
        if undo_file is not None:  # the transaction did not commit: the file would undo nothing
            undo_file.unlink(missing_ok=True)
        raise
    return applied


def _write_undo_meta(path: Path, verb: str, db_path: Path, ops: Sequence[str], before: str, after: str) -> None:
    with KernelDB.open(path, write=True) as undo:
        with undo.writing() as raw:
            raw.execute(f"CREATE TABLE {UNDO_TABLE} (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            raw.executemany(f"INSERT INTO {UNDO_TABLE} VALUES (?, ?)", [
                ("format", str(UNDO_FORMAT)), ("verb", verb), ("db", str(db_path.resolve())),
                ("ops", json.dumps(list(ops), ensure_ascii=False)), ("before", before), ("after", after)])
        # One self-contained file from here on: the undo only reads it, and a read-only reader of a WAL file
        # leaves its -wal and -shm beside it.
        undo.connection().execute("PRAGMA journal_mode = DELETE")


def iter_undo_rows(path: Path) -> Iterator[KernelRow]:
    """The rows an undo file holds, in their table order, streamed."""
    with KernelDB.open(path) as undo:
        yield from undo.iter_table_order()


def read_undo_file(path: Path) -> UndoRecord:
    """An undo file (or a set-aside file an older `leave-to-library --apply` wrote); InputError names the file and
    what is wrong with it."""
    if not path.is_file():
        raise InputError(f"{path}: no such undo file", where=str(path))
    try:
        with KernelDB.open(path) as undo, undo.reading() as raw:
            has_meta = raw.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                   (UNDO_TABLE,)).fetchone()
            meta = dict(raw.execute(f"SELECT name, value FROM {UNDO_TABLE}").fetchall()) if has_meta else {}
            old_ops = [] if meta else [ident for (ident,) in raw.execute(
                "SELECT DISTINCT Identifier FROM KernelCache ORDER BY Identifier")]
        if not meta:  # a set-aside file of old: its rows only
            return UndoRecord(path, "leave-to-library", "", tuple(old_ops), fingerprint(iter_undo_rows(path)), "")
    except (DbError, sqlite3.Error) as exc:
        raise InputError(f"{path}: not an undo file ({exc})", where=str(path)) from exc
    try:
        if int(meta["format"]) != UNDO_FORMAT:
            raise InputError(f"{path}: undo file format {meta['format']}, this kdb reads {UNDO_FORMAT}",
                             where=str(path))
        return UndoRecord(path, meta["verb"], meta["db"], tuple(json.loads(meta["ops"])), meta["before"],
                          meta["after"])
    except (KeyError, ValueError, TypeError) as exc:
        raise InputError(f"{path}: a damaged undo file ({exc!r} in its {UNDO_TABLE} table)", where=str(path)) from exc


def undo_edit(db: KernelDB, record: UndoRecord) -> DbEdit:
    """The edit that undoes an apply; reads only. InputError when the file is another DB's; DbError when the ops
    changed since the apply."""
    if record.db and Path(record.db) != db.path.resolve():
        raise InputError(f"{record.path} undoes a plan applied to {record.db}, not to {db.path}",
                         where=str(record.path))
    if not record.after:  # a set-aside file of old: its rows go back beside what is there
        return DbEdit(record.ops, insert_from=record.path)
    current = fingerprint(db.iter_op_rows(record.ops))
    if current == record.before:
        return DbEdit(record.ops)  # undone already: nothing to do
    if current != record.after:
        raise DbError(f"{db.path}: the rows of the {len(record.ops)} op(s) {record.path.name} covers changed after "
                      f"its {record.verb} was applied: undoing it would silently lose that change; nothing written")
    return DbEdit(record.ops, put_back=record.path)
