"""kdb ls: the kernels in the DB, one line each."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from console.cli.output import out, print_json, shorten
from core.db.browse import KernelFilter, list_kernels
from core.db.kernel_db import KernelDB, Schema


def main(args: argparse.Namespace) -> int:
    with KernelDB.open(args.db) as db:
        if db.schema is Schema.OSDI20:
            out.print(f"{db.path} uses the older osdi20 schema (read-only): `kdb db convert` rewrites it")
            return 0
        if db.schema is Schema.EMPTY:
            out.print(f"{db.path}: no KernelCache table yet (`kdb db init` creates it)")
            return 0
        rows = list_kernels(db, KernelFilter(op_type=args.op or ""), limit=args.limit or 0)
    if args.json:
        for r in rows:
            print_json(asdict(r))
        return 0
    from rich.table import Table

    table = Table(caption=f"{len(rows)} kernels in {db.path}", caption_justify="left")
    for col in ("op type", "identifier", "key", "grid", "block", "smem B", "barriers", "best time"):
        table.add_column(col, overflow="fold" if col == "identifier" else "ellipsis", no_wrap=col != "identifier")
    for r in rows:
        best = r.best_time()
        table.add_row(r.op_type, shorten(r.identifier, 90), r.key[:16],
                      "x".join(map(str, r.grid or [])), "x".join(map(str, r.block or [])),
                      "-" if r.shared_bytes is None else str(r.shared_bytes),
                      "-" if r.barriers is None else str(r.barriers),
                      f"{best[1]:.2f} us ({best[0]})" if best else "not measured")
    out.print(table)
    return 0
