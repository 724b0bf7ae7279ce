"""kdb failures: every failed conversion (file, item, kernel, stage, reason); retry or dismiss them."""

from __future__ import annotations

import argparse
from contextlib import closing
from pathlib import Path

from console.cli.output import out, print_json, shorten, shorten_path
from core.db.kernel_db import kernel_db_path
from core.db.state import StateDB
from core.errors import KdbError


def main(args: argparse.Namespace) -> int:
    db_path = kernel_db_path(args.db)
    with closing(StateDB()) as state:
        open_failures = state.failures(db_path)
        if args.action == "list":
            if args.json:
                print_json({"db": str(db_path), "failures": [
                    {"id": f.id, **f.as_report(), "created_at": f.created_at} for f in open_failures]})
            else:
                _print(open_failures, db_path)
            return 1 if open_failures else 0
        ids = [f.id for f in open_failures if f.id is not None] if args.all else args.ids
        if not ids:
            raise KdbError("name failure IDs, or --all")
        if args.action == "dismiss":
            state.close_failures(ids, resolved=False)
            if args.json:
                print_json({"dismissed": ids})
            else:
                out.print(f"dismissed {len(ids)} failure(s)")
            return 0
    from core.inject.pipeline import InjectOptions  # the pipeline loads only for a retry
    from core.inject.retry import retry_open_failures
    from core.settings import load_settings

    # As the Failures view's r and R: --all is every open failure when the retry starts.
    report = retry_open_failures(db_path, InjectOptions.from_settings(load_settings()), None if args.all else ids)
    if args.json:
        print_json(report.as_json())
    else:
        out.print(f"retried: {report.injected} injected, {report.unchanged} unchanged, {report.failed} failed")
    return 1 if report.failed else 0


def _print(failures: list, db_path: Path) -> None:  # type: ignore[type-arg]
    from rich.table import Table

    if not failures:
        out.print(f"[green]no open failures for {db_path}[/]")
        return
    table = Table(caption=f"{len(failures)} open failures for {db_path}", caption_justify="left")
    for col in ("id", "file", "item", "kernel", "stage", "reason"):
        table.add_column(col, overflow="fold")
    for f in failures:
        table.add_row(str(f.id), shorten_path(f.file, 48), "-" if f.item_index is None else str(f.item_index),
                      shorten(f.name, 40), f.stage, f.reason)
    out.print(table)
