"""kdb show: one kernel in full: attributes, launch config, shared memory, profile, lint, CUDA body.

The CUDA source is highlighted on a terminal only: elsewhere it is printed as it is (Pygments' lexing
cost 2 s on a large kernel, for colours nobody sees in a pipe).
"""

from __future__ import annotations

import argparse
import json
import sys

from console.cli.output import is_terminal, out, print_json, write
from core.db.kernel_db import KernelDB
from core.errors import KdbError
from core.kernels.export import write_kernel_json
from core.kernels.kernel_row import KernelRow
from core.kernels.lint import lint_kernel_row
from core.kernels.math_kind import describe
from core.kernels.rowview import describe_row


def main(args: argparse.Namespace) -> int:
    with KernelDB.open(args.db) as db:
        rows = db.find(args.key)
    if not rows:
        raise KdbError(f"no kernel with Key or Identifier {args.key!r}")
    if args.export is not None:
        count = write_kernel_json(rows, args.export)
        write(f"exported {count} kernel(s) to {args.export}; `kdb inject --replace {args.export}` rewrites them "
              "under today's rules")
        return 0
    if args.json:
        print_json({"query": args.key, "kernels": [describe_row(row) for row in rows]})
        return 0
    for row in rows:
        _print(row)
    return 0


def _print(row: KernelRow) -> None:
    from rich.panel import Panel
    from rich.table import Table

    view = describe_row(row)
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column(overflow="fold")
    for label in ("key", "identifier", "op_type", "source", "device_type", "tags", "grid", "block",
                  "num_syncthreads", "resource"):
        info.add_row(label, str(view.get(label, "")))
    info.add_row("math", describe(view["precision"], view["units"]))
    info.add_row("attributes", json.dumps(view["attributes"]))
    out.print(Panel(info, title=view.get("name") or "kernel"))
    sm = view.get("shared_memory") or []
    if sm:
        t = Table(title="shared memory")
        for col in ("symbol", "dtype", "size", "bytes"):
            t.add_column(col)
        for s in sm:
            t.add_row(s["symbol"], s["dtype"], str(s["size"]), str(s["bytes"] if s["bytes"] is not None else "?"))
        out.print(t)
    prof = Table(title="profile")
    for col in ("device", "time (us)", "resource", "time x resource"):
        prof.add_column(col)
    for p in view["profile"]:
        prof.add_row(p["device"], f"{p['us']:.3f}", str(p["resource"]), f"{p['efficiency']:.0f}")
    if not view["profile"]:
        prof.add_row("-", "not measured", str(view.get("resource")), "-")
    out.print(prof)
    findings = lint_kernel_row(row)
    for f in findings:
        out.print(f"[{'red' if f.severity != 'warning' else 'yellow'}]{f.severity}[/] {f.check}: {f.message}")
    if not findings:
        out.print("[green]lint: ok[/]")
    source = view["signature"] + "\n{\n" + view["body"] + "\n}"
    if is_terminal(sys.stdout):
        from rich.syntax import Syntax

        out.print(Syntax(source, "cuda", line_numbers=True, word_wrap=False))
    else:
        sys.stdout.flush()
        write(source + "\n")
