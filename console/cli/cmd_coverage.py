"""kdb coverage: what NNFusion will run for each op of an ONNX model with this DB (and why a row is not used)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from console.cli.output import err, out, print_json, shorten
from core.db.kernel_db import KernelDB, kernel_db_path
from core.nnfusion.compiler import CompilerFlags, extract_for_compiler
from core.nnfusion.coverage import (
    ABORTS,
    DOES_NOT_BUILD,
    FALLS_BACK,
    FUSED_AWAY,
    IN_DB,
    MISSING,
    NOT_USED,
    coverage,
    summarize,
)
from core.opconfigs.nnfusion_import import Blocker, ShapeWarning
from core.settings import load_settings

STYLE = {IN_DB: "green", MISSING: "yellow", NOT_USED: "red", FUSED_AWAY: "dim", FALLS_BACK: "magenta",
         ABORTS: "bold red", DOES_NOT_BUILD: "bold red"}


def compiler_setup(args: argparse.Namespace) -> tuple[list[str], CompilerFlags, str]:
    """The compiler flags (settings, then --flag) and product name this command works with."""
    settings = load_settings()
    flags = [*settings.nnfusion_flags, *args.flag]
    product = args.product_name if args.product_name is not None else settings.product_name
    return flags, CompilerFlags.parse(flags), product


def main(args: argparse.Namespace) -> int:
    flag_list, flags, product = compiler_setup(args)
    # a model seen before: ONNX is not even imported; the model as the compiler imports it (its pre-pass run)
    extraction = extract_for_compiler(Path(args.model), flag_list, binary=getattr(args, "nnfusion", None) or "",
                                      nnfusion_path=load_settings().nnfusion_path)
    db_path = kernel_db_path(args.db)
    created = KernelDB.create_if_missing(db_path)  # an empty DB is the answer NNFusion itself would start from
    if created:
        err.print(f"no kernel DB at {db_path} yet: created it, empty (NNFusion's table), as the compiler would",
                  highlight=False)
    with KernelDB.open(db_path) as db:
        entries = coverage(extraction, db, flags, product)
    summary = summarize(entries)
    unbuildable = [u for u in extraction.unmapped if not u.builds]  # NNFusion's own kernel for it is no valid CUDA
    findings = bool(extraction.blockers or extraction.miscompiles or unbuildable) or any(
        e.status in (MISSING, NOT_USED, ABORTS, DOES_NOT_BUILD) or e.wrong_numbers for e in entries)
    if args.json:
        print_json({"model": extraction.model_name, "file": str(Path(args.model)), "db": str(db.path),
                    "db_created": created, "flags": flag_list,
                    "product_name": product, "prepass": extraction.prepass,
                    "summary": summary, "entries": [e.to_dict() for e in entries],
                    "unmapped": [u._asdict() for u in extraction.unmapped],
                    "blockers": [b._asdict() for b in extraction.blockers],
                    "miscompiles": [w._asdict() for w in extraction.miscompiles]})
        return 1 if findings else 0
    from rich.table import Table

    ops = summary["ops"]
    shown = Path(args.model).name  # the file the user named (a torch export's graph is "main_graph" in every one)
    table = Table(caption=(
        f"{shown} with {db.path} (flags: {' '.join(flag_list) or 'defaults'}; product "
        f"{product or 'not set'}): {ops[IN_DB]} ops run DB kernels, {ops[MISSING]} missing, {ops[NOT_USED]} with "
        f"rows the compiler will not use, {ops[FUSED_AWAY]} fused away, {ops[FALLS_BACK]} fall back, "
        f"{ops[ABORTS]} abort without a row, {ops[DOES_NOT_BUILD]} do not build; DB kernels run "
        f"{summary['db_flops_share']:.0%} of the FLOPs"
        + (f" (once it compiles: {len(extraction.blockers)} node(s) below stop the compile first)"
           if extraction.blockers else "")
        + (f" (for the model's shapes: NNFusion compiles {len(wrong_shapes)} node(s) below into other shapes, and "
           "the ops after them may look up other rows)" if (wrong_shapes := [w for w in extraction.miscompiles
                                                                             if w.kind == "wrong shape"]) else "")),
        caption_justify="left")
    for col in ("status", "op type", "description", "count", "runs", "row"):
        table.add_column(col, overflow="fold", justify="right" if col == "count" else "left")
    for e in entries:
        description = e.config.describe().removeprefix(e.config.op_type).strip()
        row = "" if e.row is None else f"{shorten(e.row.key, 16)} ({e.row.rows} row{'s' * (e.row.rows > 1)})"
        table.add_row(f"[{STYLE[e.status]}]{e.status}[/]", e.config.op_type, description, str(e.count),
                      e.runs, row)
    out.print(table)
    for e in entries:
        notes = list(e.reasons) + ([f"chosen: {e.row.why}"] if e.row and e.row.rows > 1 else []) + \
            ([e.row.interplay_why + f": {shorten(e.row.interplay_key or '', 16)}"] if e.row and e.row.interplay_key
             else [])
        if notes and e.status != FUSED_AWAY:
            out.print(f"{e.config.describe()}:", markup=False, highlight=False)
            for note in notes:
                out.print(f"  - {note}", markup=False, highlight=False, soft_wrap=True)
    if extraction.unmapped:
        out.print(f"{len(extraction.unmapped)} nodes map to no kernel-DB op (`kdb opconfig extract` lists them)",
                  highlight=False)
    for u in unbuildable:
        out.print(f"[bold red]does not build[/]: node {u.node} ({u.op_type}): {u.reason}", highlight=False)
    print_miscompiles(shown, extraction.miscompiles)
    print_blockers(shown, extraction.blockers)  # last: what must change before anything else
    return 1 if findings else 0


def print_miscompiles(model: str, miscompiles: list[ShapeWarning]) -> None:
    """Nodes NNFusion compiles into another network whatever the DB holds, each with what comes out wrong."""
    _print_nodes(f"NNFusion compiles {escape(model)} into another network",
                 [f"node {w.node}: {w.kind}: {w.text}" for w in miscompiles])


def print_blockers(model: str, blockers: list[Blocker]) -> None:
    """Nodes NNFusion cannot compile whatever the DB holds, each named with its op and why."""
    _print_nodes(f"NNFusion cannot compile {escape(model)}", [f"node {b.node} ({b.op_type}): {b.reason}"
                                                               for b in blockers])


def _print_nodes(heading: str, lines: list[str]) -> None:
    if lines:
        out.print(f"[bold red]{heading}[/], whatever the DB holds ({len(lines)} node{'s' * (len(lines) != 1)}):",
                  highlight=False)
    for line in lines:
        out.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
