"""An op's rows as NNFusion's kernel selection meets them, kept so that the row it takes is the fastest.

NNFusion reads an op with `SELECT ... FROM KernelCache WHERE (Identifier = ?) AND (DeviceType = ?)` and no
ORDER BY (engine/cache/manager.cpp, fetch_all): the file has no index but the Key's, so SQLite scans the table and
the rows come in rowid order (an index on the two columns would give the same order: its entries end in the
rowid). Kernel selection (kernel_selection.cpp, FetchBasedSelector::fetch_inventory) then emits the FIRST External
row of that list and never compares profiles; without an External row, the Antares row of smallest
`Miscs.antares.time` for -fproduct_name, the first of equal times.

So every write keeps each op's CUDA_GPU rows fastest-first in rowid order (`restore_order`, called inside the
write's own transaction by core/db/kernel_db.py): rows timed on the product by their time, then rows without a
time for it, each group in its existing order. The product is the `product_name` setting; when it is empty, the
one GPU the op's rows were timed on (the CUDA device's own name is then -fproduct_name's default too); an op timed
on several GPUs with no product named is left as it is (`order_problems` names it). The CUDA twins of fused
kernels are not ordered: the pattern-substitution pass only asks whether a row is there.

A standalone op (core/db/standalone.py) has no External row; a new External row for it would be taken first and
undo the standalone state, so `standalone_columns` gives a row the standalone form of the op's other rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import InputError
from core.kernels.kernel_row import COLUMNS, KernelRow
from core.kernels.ops import BLOCK_TAG, DEFAULT_PRODUCT, DEVICE_TYPE, EXTERNAL_SOURCE, STANDALONE_SOURCE
from core.kernels.profile import parse_profile

UNPROFILED_US = 1e6  # the selector keeps the smallest time under 1e9 us: a row without a profile still counts
_INSERT = f"INSERT INTO KernelCache ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"


def time_on(miscs_text: str, device: str) -> float:
    """Microseconds on `device` from a row's Miscs; InputError when absent or unreadable."""
    try:
        miscs = json.loads(miscs_text or "{}")
    except ValueError as exc:
        raise InputError(f"Miscs is not JSON ({exc})") from exc
    profile = miscs.get("external_profile") if isinstance(miscs, dict) else None
    text = profile.get("time", "") if isinstance(profile, dict) else ""
    times = parse_profile(text)
    if device not in times:
        raise InputError(f"not measured on {device!r}" + (f" (only on {', '.join(times)})" if times else ""))
    return times[device]


def profile_times(miscs_text: str) -> dict[str, float]:
    """Device -> microseconds of a row's profile; {} when it has none or it cannot be read (`kdb lint` names it)."""
    try:
        miscs = json.loads(miscs_text or "{}")
        profile = miscs.get("external_profile") if isinstance(miscs, dict) else None
        return parse_profile(profile.get("time", "")) if isinstance(profile, dict) else {}
    except (ValueError, InputError):
        return {}


@dataclass(frozen=True, slots=True)
class OpRow:
    """What ordering and the standalone check read of one row (never its Function)."""

    rowid: int
    key: str
    source: str
    tags: str
    miscs: str


def op_rows(raw: sqlite3.Connection, identifier: str) -> list[OpRow]:
    """The op's CUDA_GPU rows in the order the compiler reads them (one scan: no index on Identifier)."""
    return [OpRow(*r) for r in raw.execute(
        "SELECT rowid, Key, Source, Tags, Miscs FROM KernelCache WHERE Identifier = ? AND DeviceType = ? "
        "ORDER BY rowid", (identifier, DEVICE_TYPE))]


def ranking_device(rows: Iterable[OpRow], product: str) -> str | None:
    """The device whose times rank these rows: the product, else the one GPU their profiles name (None: several,
    or none)."""
    if product:
        return product
    named = {device for row in rows for device in profile_times(row.miscs)}
    return named.pop() if len(named) == 1 else None


def fastest_first(rows: list[OpRow], device: str | None, places: Mapping[str, int] | None = None) -> list[OpRow]:
    """Rows timed on `device` by their time, then the others; ties keep their place (rowid, or `places`: where a
    row rewritten at a new rowid stood before). No device (the rows cannot be ranked): every row keeps its place."""
    places = places or {}

    def rank(row: OpRow) -> tuple[int, float, int]:
        us = profile_times(row.miscs).get(device) if device is not None else None
        place = places.get(row.key, row.rowid)
        return (0, us, place) if us is not None else (1, 0.0, place)

    return sorted(rows, key=rank)


def restore_order(raw: sqlite3.Connection, identifier: str, product: str,
                  places: Mapping[str, int] | None = None, rows: list[OpRow] | None = None) -> list[str]:
    """Put the op's CUDA_GPU rows fastest-first in table order, inside the caller's write transaction; the Keys
    moved. Rows from the first one out of place on are written anew at the end of the table, in order (a row's
    columns never change here). `places`: rows the caller wrote anew, and where they stood; `rows`: the op's rows
    in rowid order when the caller knows them (spares a scan of the table)."""
    rows = op_rows(raw, identifier) if rows is None else rows
    if len(rows) < 2:
        return []
    wanted = fastest_first(rows, ranking_device(rows, product), places)
    start = next((i for i, (have, want) in enumerate(zip(rows, wanted, strict=True)) if have.key != want.key), None)
    if start is None:
        return []
    moved = [row.key for row in wanted[start:]]
    for key in moved:  # each insert takes the table's largest rowid + 1: they land behind everything, in order
        values = raw.execute(f"SELECT {', '.join(COLUMNS)} FROM KernelCache WHERE Key = ?", (key,)).fetchone()
        raw.execute("DELETE FROM KernelCache WHERE Key = ?", (key,))
        raw.execute(_INSERT, tuple(values))
    return moved


@dataclass(frozen=True)
class OrderProblem:
    identifier: str
    first: str  # the Key the compiler takes now
    fastest: str  # the Key it should take ("" when the op cannot be ranked)
    why: str


def order_problems(raw: sqlite3.Connection, product: str) -> list[OrderProblem]:
    """Ops whose CUDA_GPU rows are not fastest-first for `product` (see `ranking_device`), and ops that cannot be
    ranked because their rows name several GPUs and no product is given. Reads the table once."""
    ops: dict[str, list[OpRow]] = {}
    several = {ident for (ident,) in raw.execute(
        "SELECT Identifier FROM KernelCache WHERE DeviceType = ? GROUP BY Identifier HAVING COUNT(*) > 1",
        (DEVICE_TYPE,))}
    if not several:
        return []
    for rowid, key, identifier, source, tags, miscs in raw.execute(
            "SELECT rowid, Key, Identifier, Source, Tags, Miscs FROM KernelCache WHERE DeviceType = ? ORDER BY rowid",
            (DEVICE_TYPE,)):
        if identifier in several:
            ops.setdefault(identifier, []).append(OpRow(rowid, key, source, tags, miscs))
    problems = []
    for identifier, rows in ops.items():
        device = ranking_device(rows, product)
        if device is None:
            named = sorted({d for r in rows for d in profile_times(r.miscs)})
            if len(named) > 1:
                problems.append(OrderProblem(identifier, rows[0].key, "", f"timed on {', '.join(named)}: name the "
                                             "product (the product_name setting) to rank them"))
            continue
        wanted = fastest_first(rows, device)
        if [r.key for r in wanted] != [r.key for r in rows]:
            us = profile_times(wanted[0].miscs).get(device)
            problems.append(OrderProblem(identifier, rows[0].key, wanted[0].key, (
                f"the compiler takes {rows[0].key} first; {wanted[0].key} is faster on {device}"
                + (f" ({us:g} us)" if us is not None else ""))))
    return problems


class KnownOps:
    """Which ops the table holds CUDA_GPU rows of (hashes of their Identifiers), so that inserting a new op's first
    row needs no scan: the file has no index on Identifier, and a scan per insert cost 5 ms on a 10,000-row DB.
    Rebuilt when another connection has committed (PRAGMA data_version moves only then). It may claim an op that
    is gone (a rolled-back insert): that costs one scan, never a missed order."""

    def __init__(self) -> None:
        self._hashes: set[int] | None = None
        self._version: int | None = None

    def may_have(self, raw: sqlite3.Connection, identifier: str) -> bool:
        version = raw.execute("PRAGMA data_version").fetchone()[0]
        if self._hashes is None or version != self._version:
            self._hashes = {hash(ident) for (ident,) in raw.execute(
                "SELECT Identifier FROM KernelCache WHERE DeviceType = ?", (DEVICE_TYPE,))}
            self._version = version
        return hash(identifier) in self._hashes

    def add(self, identifier: str) -> None:
        if self._hashes is not None:
            self._hashes.add(hash(identifier))


# -- the standalone form -----------------------------------------------------------------------


def is_standalone_row(source: str, tags: str) -> bool:
    return source == STANDALONE_SOURCE and BLOCK_TAG not in tags.split(",")


def standalone_product(rows: Iterable[OpRow]) -> str | None:
    """The product an op's rows are standalone for, when the op is standalone (no External row, one standalone row
    at least); else None."""
    rows = list(rows)
    if not rows or any(r.source == EXTERNAL_SOURCE for r in rows):
        return None
    for row in rows:
        if is_standalone_row(row.source, row.tags):
            try:
                entry = json.loads(row.miscs or "{}").get("antares")
            except (ValueError, AttributeError):
                continue
            if isinstance(entry, dict) and isinstance(entry.get("device_name"), str):
                return entry["device_name"]
    return None


def standalone_columns(row: KernelRow, product: str) -> tuple[str, str, dict[str, Any]]:
    """(Source, Tags, Miscs) of the row in the standalone form for `product`: Source Antares, no BlockCudaEmitter
    tag, `Miscs.antares` naming the product with the row's time on it (else UNPROFILED_US)."""
    product = product or DEFAULT_PRODUCT
    try:
        miscs = json.loads(row.miscs or "{}")
    except ValueError as exc:
        raise InputError(f"row {row.key[:20]}: Miscs is not JSON ({exc})", where=row.key) from exc
    if not isinstance(miscs, dict):
        raise InputError(f"row {row.key[:20]}: Miscs is not a JSON object", where=row.key)
    miscs["antares"] = {"device_name": product, "planned_steps": 1,
                        "time": profile_times(row.miscs).get(product, UNPROFILED_US)}
    tags = ",".join(t for t in row.tags.split(",") if t and t != BLOCK_TAG)
    return STANDALONE_SOURCE, tags, miscs
