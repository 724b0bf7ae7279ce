"""Paged, filtered, sorted views of the kernel table, computed in SQL (never all rows in memory).

Used by `kdb ls` and the console's Kernels browser. Big columns (the bodies) are not read here:
the summary comes from json_extract on the JSON columns, guarded by json_valid so one malformed
row cannot break a page.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from core.db.kernel_db import KernelDB
from core.db.summary_index import LINT_SQL, PRECISION_SQL, ROW_COLUMNS, SELECTIVE_LIMIT, SUMMARY_COLUMNS, SummaryIndex
from core.kernels.kernel_row import shared_bytes
from core.kernels.lint import quick_problem
from core.kernels.math_kind import UNITS_SQL, precision
from core.kernels.ops import op_of_row
from core.kernels.profile import parse_profile

SORTABLE = {
    "op": "OpType",
    "identifier": "Identifier",
    "source": "Source",
    "device": "DeviceType",
    "tags": "Tags",
    "barriers": "barriers",
    "threads": "threads",
    "blocks": "blocks",
    "key": "Key",
}



TAG_SQL = "(',' || {tags} || ',') LIKE ? ESCAPE '\\'"


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def tag_pattern(tag: str) -> str:
    return "%," + _like_escaped(tag) + ",%"


# LIKE ignores ASCII case and, field by field, allocates nothing: the cheapest test a walk can make per row.
TEXT_SQL = "({identifier} LIKE ? ESCAPE '\\' OR {name} LIKE ? ESCAPE '\\' OR {key} LIKE ? ESCAPE '\\')"


def text_pattern(text: str) -> str:
    return "%" + _like_escaped(text) + "%"


@dataclass(frozen=True)
class KernelFilter:
    text: str = ""  # part of the identifier, kernel name or Key, ignoring ASCII case
    op_type: str = ""
    source: str = ""
    tag: str = ""
    device: str = ""
    lint: str = ""  # "", "ok" or "problems"
    precision: str = ""  # "", or one of math_kind.PRECISIONS
    units: str = ""  # "", or one of math_kind.UNITS

    def where(self) -> tuple[str, list[Any]]:
        clauses, params = [], []
        if self.text:
            name = "CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.kdb.name') END"
            clauses.append(TEXT_SQL.format(identifier="Identifier", name=name, key="Key"))
            params += [text_pattern(self.text)] * 3
        if self.op_type:
            clauses.append("OpType = ?")
            params.append(self.op_type)
        if self.source:
            clauses.append("Source = ?")
            params.append(self.source)
        if self.tag:
            clauses.append(TAG_SQL.format(tags="Tags"))
            params.append(tag_pattern(self.tag))
        if self.device:
            clauses.append("DeviceType = ?")
            params.append(self.device)
        if self.lint == "ok":
            clauses.append(f"{LINT_SQL} = ''")
        elif self.lint == "problems":
            clauses.append(f"{LINT_SQL} != ''")
        if self.precision:
            clauses.append(f"{PRECISION_SQL} = ?")
            params.append(self.precision)
        if self.units:
            clauses.append(f"{UNITS_SQL.format(function='Function')} = ?")
            params.append(self.units)
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


@dataclass
class KernelSummary:
    key: str
    identifier: str
    op_type: str
    source: str
    device_type: str
    tags: str
    grid: list[int] | None
    block: list[int] | None
    barriers: int | None
    shared_bytes: int | None
    times: dict[str, float] = field(default_factory=dict)  # device -> us
    profile_error: str = ""
    resource: int | None = None
    name: str = ""
    problem: str = ""  # first lint problem found without reading bodies ('' when none)
    precision: str = ""  # fp16, tf32, fp32 or fp64 (core/kernels/math_kind.py)
    units: str = ""  # the tensor cores or the CUDA cores

    @property
    def op(self) -> str:
        """kdb's op type (a BatchMatMul row's OpType column says Dot: KernelRow.op)."""
        return op_of_row(self.op_type, self.identifier)

    def best_time(self) -> tuple[str, float] | None:
        if not self.times:
            return None
        device = min(self.times, key=self.times.__getitem__)
        return device, self.times[device]


_FILTER_SQL = """SELECT rowid, *,
  CASE WHEN json_valid(Function) THEN json_extract(Function, '$.num_syncthreads') END AS barriers,
  CASE WHEN json_valid(Function) THEN json_extract(Function, '$.block_dim[0]')
       * json_extract(Function, '$.block_dim[1]') * json_extract(Function, '$.block_dim[2]') END AS threads,
  CASE WHEN json_valid(Function) THEN json_extract(Function, '$.grid_dim[0]') * json_extract(Function, '$.grid_dim[1]')
       * json_extract(Function, '$.grid_dim[2]') END AS blocks
  FROM KernelCache"""

_SUMMARY_SQL = f"SELECT rowid, {SUMMARY_COLUMNS} FROM KernelCache"


def _summary(r: tuple[Any, ...]) -> KernelSummary:
    def as_list(v: Any) -> list[int] | None:
        try:
            got = json.loads(v) if isinstance(v, str) else None
        except ValueError:
            return None
        return got if isinstance(got, list) else None

    sm = None
    if isinstance(r[9], str):
        try:
            sm = shared_bytes({"shared_memory": json.loads(r[9])})
        except ValueError:
            sm = None
    times: dict[str, float] = {}
    err = ""
    if isinstance(r[10], str):
        try:
            times = parse_profile(r[10])
        except Exception as exc:
            err = str(exc)
    return KernelSummary(
        key=r[0], identifier=r[1], op_type=r[2], source=r[3] or "", device_type=r[4] or "", tags=r[5] or "",
        grid=as_list(r[6]), block=as_list(r[7]), barriers=r[8] if isinstance(r[8], int) else None,
        shared_bytes=sm, times=times, profile_error=err,
        resource=r[11] if isinstance(r[11], int) else None, name=r[12] if isinstance(r[12], str) else "",
        problem=r[13] or "", precision=r[14] or "", units=r[15] or "",
    )


def list_kernels(db: KernelDB, flt: KernelFilter | None = None, *, sort: str = "op", descending: bool = False,
                 offset: int = 0, limit: int = 100) -> list[KernelSummary]:
    return list(iter_kernels(db, flt, sort=sort, descending=descending, offset=offset, limit=limit))


def iter_kernels(db: KernelDB, flt: KernelFilter | None = None, *, sort: str = "op", descending: bool = False,
                 offset: int = 0, limit: int = 100, batch: int = 500) -> Iterator[KernelSummary]:
    """The summaries of a page (limit 0: every match), streamed a batch at a time in one read transaction.

    Sorted by Key, the first batch comes from walking the Key index: its time does not grow with the DB.
    """
    flt = flt or KernelFilter()
    where, params = flt.where()
    column = SORTABLE.get(sort, "OpType")
    direction = "DESC" if descending else "ASC"
    order = f"{column} {direction}, rowid {direction}"  # rowid: the browse index breaks ties the same way
    # Two steps: the batch's rowids first, so the summary columns (which read every row's Function) are
    # computed for those rows alone; SQLite's sorter would otherwise evaluate them for the whole table.
    page_sql = f"SELECT rowid FROM ({_FILTER_SQL}) {where} ORDER BY {order} LIMIT ? OFFSET ?"
    register_functions(db.connection())
    with db.reading() as conn:
        pages = conn.execute(page_sql, (*params, limit if limit > 0 else -1, offset))
        while rowids := [r[0] for r in pages.fetchmany(min(batch, 500))]:  # within SQLite's parameter limit
            sql = f"{_SUMMARY_SQL} WHERE rowid IN ({', '.join('?' * len(rowids))})"
            rows = {r[0]: r[1:] for r in conn.execute(sql, tuple(rowids))}
            yield from (_summary(tuple(rows[i])) for i in rowids if i in rows)


def count_kernels(db: KernelDB, flt: KernelFilter | None = None) -> int:
    where, params = (flt or KernelFilter()).where()
    register_functions(db.connection())
    return db.count(where, params)


def register_functions(conn: sqlite3.Connection) -> None:
    """The SQL functions the browser's queries use (registering again replaces them: cheap)."""
    conn.create_function("kdb_quick_problem", 10, quick_problem, deterministic=True)
    conn.create_function("kdb_precision", 2, precision, deterministic=True)


def op_types(db: KernelDB) -> list[tuple[str, int]]:
    with db.reading() as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT OpType, count(*) FROM KernelCache GROUP BY OpType ORDER BY OpType")]


# -- the same views answered from the browse index (core/db/summary_index.py) --------------------------

INDEX_SORTABLE = {"op": "op", "identifier": "identifier", "source": "source", "device": "device", "tags": "tags",
                  "barriers": "barriers", "threads": "threads", "blocks": "blocks", "key": "key"}


def _index_where(flt: KernelFilter, prefix: str = "s.") -> tuple[list[str], list[Any]]:
    """Every filter but the text one, over the summary table."""
    clauses, params = [], []
    for value, column in ((flt.op_type, "op"), (flt.source, "source"), (flt.device, "device"),
                          (flt.precision, "precision"), (flt.units, "units")):
        if value:
            clauses.append(f"{prefix}{column} = ?")
            params.append(value)
    if flt.tag:
        clauses.append(TAG_SQL.format(tags=f"{prefix}tags"))
        params.append(tag_pattern(flt.tag))
    if flt.lint:  # written as the by_problem index's expression, so that index answers it
        clauses.append(f"({prefix}problem != '') = {int(flt.lint == 'problems')}")
    return clauses, params


def _index_plan(index: SummaryIndex, flt: KernelFilter) -> tuple[str, list[str], list[Any]]:
    """FROM clause, WHERE clauses and their parameters for a filter.

    Text matches identifier, kernel name or Key, ignoring ASCII case. A text that few rows contain is looked
    up in the trigram index (its LIKE treats _ and % as wildcards, so the exact test follows); a short or
    common one is tested row by row while a sort index is walked, which finds a page of matches early.
    """
    clauses, params = _index_where(flt)
    source = "summary AS s"
    if flt.text:
        if len(flt.text) >= 3:
            like = f"%{flt.text}%"
            found = index.query("SELECT count(*) FROM (SELECT rowid FROM search_text WHERE search LIKE ? LIMIT ?)",
                                (like, SELECTIVE_LIMIT))[0][0]
            if found < SELECTIVE_LIMIT:
                # CROSS JOIN keeps the few matches as the outer loop: no walk over the whole table.
                source = "(SELECT rowid AS rid FROM search_text WHERE search LIKE ?) AS m CROSS JOIN summary AS s " \
                         "ON s.rid = m.rid"
                params.insert(0, like)
        clauses.append(TEXT_SQL.format(identifier="s.identifier", name="s.name", key="s.key"))
        params += [text_pattern(flt.text)] * 3
    return source, clauses, params


def list_kernels_indexed(index: SummaryIndex, flt: KernelFilter | None = None, *, sort: str = "op",
                         descending: bool = False, offset: int = 0, limit: int = 100) -> list[KernelSummary]:
    """Like list_kernels, from the browse index (which may be a sync behind the DB)."""
    flt = flt or KernelFilter()
    source, clauses, params = _index_plan(index, flt)
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    direction = "DESC" if descending else "ASC"
    column = INDEX_SORTABLE.get(sort, "op")
    columns = ", ".join(f"s.{c.strip()}" for c in ROW_COLUMNS.split(","))
    sql = (f"SELECT {columns} FROM {source} {where} ORDER BY s.{column} {direction}, s.rid {direction} "
           f"LIMIT ? OFFSET ?")
    return [_summary(r) for r in index.query(sql, (*params, limit if limit > 0 else -1, offset))]


def count_kernels_indexed(index: SummaryIndex, flt: KernelFilter | None = None) -> int:
    flt = flt or KernelFilter()
    if flt == KernelFilter():
        return index.rows
    source, clauses, params = _index_plan(index, flt)
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return index.query(f"SELECT count(*) FROM {source} {where}", tuple(params))[0][0]
