"""kdb lint: every row the compiler could never fetch or would crash on, with the reason.

On a terminal: a table of the first findings. Elsewhere: every finding as a tab-separated line (row, severity,
check, Key, identifier, message). Findings are remembered until the DB file changes (core/db/lint_cache.py).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from console.cli.output import is_terminal, out, print_json, shorten, write
from core.db.kernel_db import KernelDB, Schema
from core.db.lint_cache import lint_db
from core.kernels.lint import Finding

PAGE = 50  # findings in the table on a terminal


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
    elif not is_terminal(sys.stdout):  # plain lines for scripts and logs, every finding
        for f in findings:
            write("\t".join((str(f.rowid), f.severity, f.check, f.key, f.identifier, f.message)) + "\n")
        print(f"{len(findings)} findings in {total} rows", file=sys.stderr)
    elif not findings:
        out.print(f"[green]{total} rows, no findings[/]")
    else:
        _print_table(findings, total)
    return 1 if bad else 0


def _print_table(findings: list[Finding], total: int) -> None:
    """The first page of findings (a table of thousands would take Rich minutes to lay out)."""
    from rich.table import Table

    shown = findings[:PAGE]
    more = f"; the first {PAGE} shown (`kdb lint | less` lists every one)" if len(findings) > PAGE else ""
    table = Table(caption=f"{len(findings)} findings in {total} rows{more}", caption_justify="left")
    for col in ("row", "severity", "check", "identifier", "message"):
        table.add_column(col, overflow="fold")
    for f in shown:
        style = "red" if f.severity == "crash" else "magenta" if f.severity == "unreachable" else "yellow"
        table.add_row(str(f.rowid), f"[{style}]{f.severity}[/]", f.check, shorten(f.identifier, 50), f.message)
    out.print(table)
