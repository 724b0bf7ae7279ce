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
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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
    put_back: tuple[KernelRow, ...] | None = None  # an undo: the ops' rows become exactly these
    insert: tuple[KernelRow, ...] = ()  # rows written back, Keys the DB has left alone (a set-aside file of old)

    @property
    def empty(self) -> bool:
        return not (self.delete or self.rewrite or self.add_twins or self.reorder or self.insert) \
            and self.put_back is None


@dataclass
class Applied:
    undo_file: Path | None  # None: nothing was written
    deleted: list[KernelRow] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)
    twins: list[KernelRow] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    written: int = 0  # rows a put_back or insert wrote


@dataclass(frozen=True)
class UndoRecord:
    """An undo file read back."""

    path: Path
    verb: str  # the plan it undoes
    db: str  # the DB it was applied to ("" in a set-aside file of old, which names none)
    ops: tuple[str, ...]
    rows: tuple[KernelRow, ...]  # the ops' rows before the apply, in table order
    before: str  # fingerprint of those rows
    after: str  # fingerprint of the ops' rows the apply left ("" in a set-aside file of old)


def fingerprint(rows: Sequence[KernelRow]) -> str:
    """Each op's rows (Identifier, DeviceType), every column, in their table order, in a few bytes: what NNFusion
    reads. Equal fingerprints, equal rows; where one op's rows stand among another's does not count (a rewrite moves a
    row to the table's end without changing what the compiler sees)."""
    ops: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    for row in rows:
        ops.setdefault((row.identifier, row.device_type), []).append(row.values())
    return hashlib.sha256(json.dumps(sorted(ops.items()), ensure_ascii=False).encode()).hexdigest()


def apply_edit(db: KernelDB, edit: DbEdit, *, verb: str, expected: str, undo_dir: Path | None = None) -> Applied:
    """Write `edit` in one transaction, the undo file first (inside it); `expected`: the fingerprint of the ops'
    rows the plan was made from (DbError, nothing written, when the DB has moved on since)."""
    if edit.empty:
        return Applied(None)
    undo_file: Path | None = None
    try:
        with db.batch():
            before = db.op_snapshot(edit.ops)
            if fingerprint(before) != expected:
                raise DbError(f"{db.path}: the rows of the {len(edit.ops)} op(s) this plan changes are no longer "
                              "those it was made from (another write came between): nothing written; make the "
                              "plan again")
            applied = Applied(None)
            if edit.put_back is not None:
                applied.written = db.put_back(edit.ops, edit.put_back)
            if edit.insert:
                applied.written += db.restore(edit.insert)
            applied.moved = db.put_in_order(edit.reorder) if edit.reorder else []
            applied.deleted = list(db.delete(edit.delete)) if edit.delete else []
            if edit.rewrite:
                db.update_rows(edit.rewrite)
                applied.rewritten = [key for key, _ in edit.rewrite]
            applied.twins = db.add_twins(edit.add_twins) if edit.add_twins else []
            after = db.op_snapshot(edit.ops)
            undo_file = _write_undo_file(undo_dir or state_dir() / "undo", verb, db.path, edit.ops, before,
                                         fingerprint(after))
            applied.undo_file = undo_file
    except BaseException:
        if undo_file is not None:  # the transaction did not commit: the file would undo nothing
            undo_file.unlink(missing_ok=True)
        raise
    return applied


def _write_undo_file(folder: Path, verb: str, db_path: Path, ops: Sequence[str], before: Sequence[KernelRow],
                     after: str) -> Path:
    path = new_db_file(folder, f"undo-{verb}")
    try:
        with KernelDB.open(path, create=True) as undo:
            undo.put_back((), before)
            with undo.writing() as raw:
                raw.execute(f"CREATE TABLE {UNDO_TABLE} (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
                raw.executemany(f"INSERT INTO {UNDO_TABLE} VALUES (?, ?)", [
                    ("format", str(UNDO_FORMAT)), ("verb", verb), ("db", str(db_path.resolve())),
                    ("ops", json.dumps(list(ops), ensure_ascii=False)), ("before", fingerprint(before)),
                    ("after", after)])
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def read_undo_file(path: Path) -> UndoRecord:
    """An undo file (or a set-aside file an older `leave-to-library --apply` wrote); InputError names the file and
    what is wrong with it."""
    if not path.is_file():
        raise InputError(f"{path}: no such undo file", where=str(path))
    try:
        with KernelDB.open(path) as undo:
            rows = tuple(undo.iter_table_order())
            with undo.reading() as raw:
                has_meta = raw.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                       (UNDO_TABLE,)).fetchone()
                meta = dict(raw.execute(f"SELECT name, value FROM {UNDO_TABLE}").fetchall()) if has_meta else {}
    except (DbError, sqlite3.Error) as exc:
        raise InputError(f"{path}: not an undo file ({exc})", where=str(path)) from exc
    if not meta:  # a set-aside file of old: its rows only
        return UndoRecord(path, "leave-to-library", "", tuple(dict.fromkeys(r.identifier for r in rows)), rows,
                          fingerprint(rows), "")
    try:
        if int(meta["format"]) != UNDO_FORMAT:
            raise InputError(f"{path}: undo file format {meta['format']}, this kdb reads {UNDO_FORMAT}",
                             where=str(path))
        ops = json.loads(meta["ops"])
        return UndoRecord(path, meta["verb"], meta["db"], tuple(ops), rows, meta["before"], meta["after"])
    except (KeyError, ValueError, TypeError) as exc:
        raise InputError(f"{path}: a damaged undo file ({exc!r} in its {UNDO_TABLE} table)", where=str(path)) from exc


def undo_edit(db: KernelDB, record: UndoRecord) -> tuple[DbEdit, list[KernelRow]]:
    """The edit that undoes an apply, and the ops' rows now (to say what goes and what comes back); reads only.
    InputError when the file is another DB's; DbError when the ops changed since the apply."""
    if record.db and Path(record.db) != db.path.resolve():
        raise InputError(f"{record.path} undoes a plan applied to {record.db}, not to {db.path}",
                         where=str(record.path))
    now = db.op_snapshot(record.ops)
    if not record.after:  # a set-aside file of old: its rows go back beside what is there
        return DbEdit(record.ops, insert=record.rows), now
    current = fingerprint(now)
    if current == record.before:
        return DbEdit(record.ops), now  # undone already: nothing to do
    if current != record.after:
        raise DbError(f"{db.path}: the rows of the {len(record.ops)} op(s) {record.path.name} covers changed after "
                      f"its {record.verb} was applied: undoing it would silently lose that change; nothing written")
    return DbEdit(record.ops, put_back=record.rows), now

