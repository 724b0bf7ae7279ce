"""kdb lint: every row the compiler could never fetch or would crash on, with the reason."""

from __future__ import annotations

import argparse
from collections import Counter

from console.cli.output import out, print_json, shorten
from core.db.kernel_db import KernelDB, Schema
from core.db.lint_cache import lint_db


def main(args: argparse.Namespace) -> int:
    with KernelDB.open(args.db) as db:
        if db.schema is not Schema.CURRENT:
            if args.json:
                print_json({"rows": 0, "findings": [], "by_severity": {}, "schema": db.schema.value})
            else:
                out.print(f"{db.path}: schema {db.schema.value}; nothing to lint")
            return 0
        total, findings = lint_db(db)
    bad = [f for f in findings if f.severity != "warning"]
    if args.json:
        print_json({"rows": total, "findings": [f.as_dict() for f in findings],
                    "by_severity": dict(Counter(f.severity for f in findings))})
    elif not findings:
        out.print(f"[green]{total} rows, no findings[/]")
    else:
        from rich.table import Table

        table = Table(caption=f"{len(findings)} findings in {total} rows", caption_justify="left")
        for col in ("row", "severity", "check", "identifier", "message"):
            table.add_column(col, overflow="fold")
        for f in findings:
            style = "red" if f.severity == "crash" else "magenta" if f.severity == "unreachable" else "yellow"
            table.add_row(str(f.rowid), f"[{style}]{f.severity}[/]", f.check, shorten(f.identifier, 50), f.message)
        out.print(table)
    return 1 if bad else 0
