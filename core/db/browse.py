"""Paged, filtered, sorted views of the kernel table, computed in SQL (never all rows in memory).

Used by `kdb ls` and the console's Kernels browser. Big columns (the bodies) are not read here:
the summary comes from json_extract on the JSON columns, guarded by json_valid so one malformed
row cannot break a page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from core.db.kernel_db import KernelDB
from core.kernel_row import shared_bytes
from core.lint import quick_problem
from core.profile import parse_profile

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


LINT_SQL = ("kdb_quick_problem(OpType, Attributes, Identifier, Source, DeviceType, Tags, json_valid(Function), "
            "json_valid(Miscs), CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.external_profile.time') END, "
            "CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.external_profile.resource') END)")


@dataclass(frozen=True)
class KernelFilter:
    text: str = ""  # substring of the identifier or kernel name, or a Key prefix
    op_type: str = ""
    source: str = ""
    tag: str = ""
    device: str = ""
    lint: str = ""  # "", "ok" or "problems"

    def where(self) -> tuple[str, list[Any]]:
        clauses, params = [], []
        if self.text:
            clauses.append("(instr(Identifier, ?) > 0 OR substr(Key, 1, ?) = ? OR instr(CASE WHEN json_valid(Miscs) "
                           "THEN json_extract(Miscs, '$.kdb.name') END, ?) > 0)")
            params += [self.text, len(self.text), self.text, self.text]
        if self.op_type:
            clauses.append("OpType = ?")
            params.append(self.op_type)
        if self.source:
            clauses.append("Source = ?")
            params.append(self.source)
        if self.tag:
            clauses.append("(',' || Tags || ',') LIKE ? ESCAPE '\\'")
            params.append("%," + self.tag.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ",%")
        if self.device:
            clauses.append("DeviceType = ?")
            params.append(self.device)
        if self.lint == "ok":
            clauses.append(f"{LINT_SQL} = ''")
        elif self.lint == "problems":
            clauses.append(f"{LINT_SQL} != ''")
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

_SUMMARY_SQL_TEMPLATE = """
SELECT rowid, Key, Identifier, OpType, Source, DeviceType, Tags,
  CASE WHEN json_valid(Function) THEN json_extract(Function, '$.grid_dim') END,
  CASE WHEN json_valid(Function) THEN json_extract(Function, '$.block_dim') END,
  CASE WHEN json_valid(Function) THEN json_extract(Function, '$.num_syncthreads') END,
  CASE WHEN json_valid(Function) THEN json_extract(Function, '$.shared_memory') END,
  CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.external_profile.time') END,
  CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.external_profile.resource') END,
  CASE WHEN json_valid(Miscs) THEN json_extract(Miscs, '$.kdb.name') END,
  {lint}
FROM KernelCache
"""
_SUMMARY_SQL = _SUMMARY_SQL_TEMPLATE.replace("{lint}", LINT_SQL)


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
        problem=r[13] or "",
    )


def list_kernels(db: KernelDB, flt: KernelFilter | None = None, *, sort: str = "op", descending: bool = False,
                 offset: int = 0, limit: int = 100) -> list[KernelSummary]:
    flt = flt or KernelFilter()
    where, params = flt.where()
    column = SORTABLE.get(sort, "OpType")
    order = f"{column} {'DESC' if descending else 'ASC'}, Key"
    # Two steps: the page's rowids first, so the summary columns (which read every row's Function) are
    # computed for the page alone; SQLite's sorter would otherwise evaluate them for the whole table.
    page_sql = f"SELECT rowid FROM ({_FILTER_SQL}) {where} ORDER BY {order} LIMIT ? OFFSET ?"
    conn = db.connection()
    register_functions(conn)
    with conn.begin():
        rowids = [r[0] for r in conn.exec_driver_sql(page_sql, (*params, limit if limit > 0 else -1, offset))]
        rows: dict[int, Any] = {}
        for start in range(0, len(rowids), 500):  # within SQLite's bound-parameter limit
            chunk = rowids[start:start + 500]
            sql = f"{_SUMMARY_SQL} WHERE rowid IN ({', '.join('?' * len(chunk))})"
            rows.update((r[0], r[1:]) for r in conn.exec_driver_sql(sql, tuple(chunk)))
    return [_summary(tuple(rows[i])) for i in rowids if i in rows]


def count_kernels(db: KernelDB, flt: KernelFilter | None = None) -> int:
    where, params = (flt or KernelFilter()).where()
    register_functions(db.connection())
    return db.count(where, params)


def register_functions(conn: sa.Connection) -> None:
    """The SQL functions the browser's queries use (once per connection)."""
    if conn.info.get("kdb_functions"):
        return
    raw = conn.connection.driver_connection
    raw.create_function("kdb_quick_problem", 10, quick_problem, deterministic=True)  # type: ignore[union-attr]
    conn.info["kdb_functions"] = True


def op_types(db: KernelDB) -> list[tuple[str, int]]:
    conn = db.connection()
    with conn.begin():
        return [(r[0], r[1]) for r in conn.exec_driver_sql(
            "SELECT OpType, count(*) FROM KernelCache GROUP BY OpType ORDER BY OpType")]
