"""kdb coverage: which op configs of an ONNX model have a kernel in the DB, which to tune, which fall back."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from console.cli.output import out, print_json
from core.db.kernel_db import KernelDB
from core.kernels.ops import DEVICE_TYPE
from core.opconfigs.coverage import IN_DB, MISSING, CoverageEntry, coverage
from core.opconfigs.extract_cache import extract_cached


def main(args: argparse.Namespace) -> int:
    extraction = extract_cached(Path(args.model))  # a model seen before: ONNX is not even imported
    with KernelDB.open(args.db) as db:
        entries = coverage(extraction, db, DEVICE_TYPE)
    summary = Counter(_kind(e) for e in entries)
    if args.json:
        print_json({"model": extraction.model_name, "db": str(db.path), "device_type": DEVICE_TYPE,
                    "summary": dict(summary), "flops_in_db": _flops_share(entries),
                    "entries": [e.to_dict() for e in entries],
                    "unmapped": [u._asdict() for u in extraction.unmapped]})
        return _status(summary)
    from rich.table import Table

    table = Table(caption=f"{extraction.model_name} against {db.path} ({DEVICE_TYPE}): {summary[IN_DB]} in DB, "
                  f"{summary[MISSING]} missing (tune these), {summary['falls back']} fall back; DB kernels cover "
                  f"{_flops_share(entries):.0%} of the FLOPs of these ops", caption_justify="left")
    for col in ("status", "op type", "description", "count", "kernels", "fallback"):
        table.add_column(col, overflow="fold", justify="right" if col in ("count", "kernels") else "left")
    style = {IN_DB: "green", MISSING: "yellow", "falls back": "magenta"}
    for e in entries:
        description = e.config.describe().removeprefix(e.config.op_type).strip()
        table.add_row(f"[{style[_kind(e)]}]{_kind(e)}[/]", e.config.op_type, description, str(e.count),
                      str(e.kernels), e.fallback)
    out.print(table)
    for status in dict.fromkeys(e.status for e in entries if _kind(e) == "falls back"):
        out.print(status, markup=False, highlight=False, soft_wrap=True)
    if extraction.unmapped:
        out.print(f"{len(extraction.unmapped)} nodes map to no kernel-DB op (`kdb opconfig extract` lists them)",
                  highlight=False)
    return _status(summary)


def _status(summary: Counter[str]) -> int:
    """1 when ops lack a kernel that tuning could supply (findings, as the README says); fall-backs with no
    kernel-DB op type are not: nothing can be put in the DB for them."""
    return 1 if summary[MISSING] else 0


def _kind(entry: CoverageEntry) -> str:
    return entry.status if entry.status in (IN_DB, MISSING) else "falls back"


def _flops_share(entries: list[CoverageEntry]) -> float:
    """Share of the model's FLOPs (in these ops) that run a DB kernel: what tuning has covered so far."""
    total = sum(e.config.flops * e.count for e in entries)
    covered = sum(e.config.flops * e.count for e in entries if e.status == IN_DB)
    return covered / total if total else 0.0
