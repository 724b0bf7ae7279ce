"""kdb ls: the kernels in the DB, a page at a time, with the Kernels view's filters.

On a terminal: a table of the first page. Elsewhere: plain tab-separated lines, streamed, so a pipe sees
the first line at once whatever the DB's size. --json: one JSON object (streamed too); --jsonl: a line per
kernel. In Key order by default, which SQLite reads off the Key index: a page costs the same in any DB.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import asdict
from itertools import islice
from pathlib import Path

from console.cli.output import is_terminal, out, print_json, shorten, write
from core.db.browse import KernelFilter, KernelSummary, iter_kernels
from core.db.kernel_db import KernelDB, Schema, init_command, kernel_db_path
from core.kernels.math_kind import CUDA_CORES, TENSOR_CORES, label

PAGE = 50  # rows shown without --limit or --all
COLUMNS = ("op type", "identifier", "key", "grid", "block", "smem B", "barriers", "best time", "math")


def _no_kernels(args: argparse.Namespace, path: Path, schema: str, note: str) -> int:
    if args.json:
        print_json({"db": str(path), "schema": schema, "note": note, "kernels": [], "more": False})
    elif not args.jsonl:
        out.print(note, markup=False, highlight=False, soft_wrap=True)  # one line: scripts grep it for the command
    return 0


def main(args: argparse.Namespace) -> int:
    flt = KernelFilter(text=args.text or "", op_type=args.op or "", source=args.source or "", tag=args.tag or "",
                       device=args.device or "", lint=args.lint or "", precision=args.precision or "",
                       units={"tensor": TENSOR_CORES, "cuda": CUDA_CORES}.get(args.units or "", ""))
    limit = 0 if args.all else args.limit or PAGE
    path = kernel_db_path(args.db)
    # Nothing to list, and a listing creates no file. A dangling link is no "not yet": KernelDB.open names it.
    if not path.exists() and not path.is_symlink():
        return _no_kernels(args, path, "missing", f"no kernel DB at {path} yet (`{init_command(path)}` creates it; "
                           "`kdb inject` and `kdb tune` create it as they write)")
    with KernelDB.open(path) as db:
        if db.schema is not Schema.CURRENT:
            return _no_kernels(args, db.path, db.schema.value,
                               f"{db.path}: no KernelCache table yet (`{init_command(db.path)}` creates it)"
                               if db.schema is Schema.EMPTY else
                               f"{db.path} uses the older osdi20 schema (read-only): `kdb db convert` rewrites it")
        # One row past the page says whether there are more, without counting the whole table.
        rows = iter_kernels(db, flt, sort=args.sort, descending=args.desc, limit=limit + 1 if limit else 0)
        with closing(rows):  # its read transaction ends here, before the DB closes, even if the pipe broke
            _print(_Page(rows, limit), db, flt, args)
    return 0


def _print(page: _Page, db: KernelDB, flt: KernelFilter, args: argparse.Namespace) -> None:
    if args.json:
        _print_json_object(page, db, flt, args.sort)
    elif args.jsonl:
        for r in page:
            print_json(asdict(r))
    elif is_terminal(sys.stdout) and page.limit:
        _print_table(list(page), page.more, db)
    else:
        _print_lines(page)
        if page.more:
            print(f"(first {page.limit} rows: --limit N or --all for more)", file=sys.stderr)


class _Page:
    """At most limit rows of a stream (limit 0: all of them); more says whether the stream held another."""

    def __init__(self, rows: Iterable[KernelSummary], limit: int) -> None:
        self.rows, self.limit, self.more = iter(rows), limit, False

    def __iter__(self) -> Iterator[KernelSummary]:
        yield from islice(self.rows, self.limit or None)
        self.more = bool(self.limit) and next(self.rows, None) is not None


def _cells(r: KernelSummary) -> tuple[str, ...]:
    best = r.best_time()
    return (r.op, r.identifier, r.key, "x".join(map(str, r.grid or [])), "x".join(map(str, r.block or [])),
            "-" if r.shared_bytes is None else str(r.shared_bytes), "-" if r.barriers is None else str(r.barriers),
            f"{best[1]:.2f} us ({best[0]})" if best else "not measured", label(r.precision, r.units))


def _print_lines(rows: Iterable[KernelSummary]) -> None:
    for r in rows:
        write("\t".join(_cells(r)) + "\n")
    sys.stdout.flush()


def _print_json_object(page: _Page, db: KernelDB, flt: KernelFilter, sort: str) -> None:
    """One JSON object, written as the rows come: memory stays flat with --all on any DB."""
    head = json.dumps({"db": str(db.path), "filter": asdict(flt), "sort": sort}, ensure_ascii=False)
    write(head[:-1] + ', "kernels": [')
    for i, r in enumerate(page):
        write(("" if i == 0 else ", ") + json.dumps(asdict(r), ensure_ascii=False))
    write(f'], "more": {json.dumps(page.more)}}}\n')
    sys.stdout.flush()


def _print_table(rows: list[KernelSummary], more: bool, db: KernelDB) -> None:
    from rich.table import Table

    caption = f"{len(rows)} kernels in {db.path}" + (" (more: --limit N or --all)" if more else "")
    table = Table(caption=caption, caption_justify="left")
    for col in COLUMNS:
        table.add_column(col, overflow="fold" if col == "identifier" else "ellipsis", no_wrap=col != "identifier")
    for r in rows:
        cells = _cells(r)
        table.add_row(cells[0], shorten(cells[1], 90), cells[2][:16], *cells[3:])
    out.print(table)
