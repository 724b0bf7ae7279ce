"""kdb opconfig: extract the op configs of an ONNX model, or check op-config files."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from console.cli.opconfig_input import lookup_flags
from console.cli.output import out, print_json, shorten
from core.errors import InputError
from core.nnfusion.compiler import extract_for_compiler
from core.opconfigs.onnx_extract import Extraction
from core.opconfigs.opconfig import OpConfig, dedupe, read_opconfigs, write_opconfigs
from core.settings import load_settings


def main(args: argparse.Namespace) -> int:
    if args.opconfig_command == "extract":
        return _extract(args)
    return _check(args)


def _extract(args: argparse.Namespace) -> int:
    flag_list, _ = lookup_flags(args)
    extraction = extract_for_compiler(Path(args.model), flag_list, binary=getattr(args, "nnfusion", None) or "",
                                      nnfusion_path=load_settings().nnfusion_path)  # as the Op configs view's import
    looked_up = extraction.looked_up()
    written = write_opconfigs(looked_up, Path(args.output)) if args.output else None
    status = 1 if extraction.blockers else 0  # (a model NNFusion cannot compile is a finding, as coverage says)
    if args.json:
        print_json({**extraction.to_dict(), "compiler_flags": flag_list, "looked_up": len(looked_up),
                    "written": str(written) if written else None})
        return status
    print_extraction(extraction, args.model)
    if written:
        out.print(f"written: {written}" + ("" if looked_up else " (empty: no op config the compiler looks up)"),
                  markup=False, highlight=False, soft_wrap=True)
    return status


def _description(config: OpConfig) -> str:
    # describe() starts with the op type, which has its own column.
    return config.describe().removeprefix(config.op_type).strip()


def print_extraction(extraction: Extraction, model: str) -> None:
    """The extraction's tables, notes and blockers, the model named by its file (a torch export's graph is always
    main_graph)."""
    from rich.markup import escape
    from rich.table import Table

    ops = sum(extraction.count(c) for c in extraction.configs)
    away = extraction.fused_away()
    looked_up = extraction.looked_up()
    fused = (f"; {len(extraction.configs) - len(looked_up)} more fused into NNFusion's own element-wise kernels at "
             f"-fkernel_fusion_level={extraction.kernel_fusion_level}, never looked up, not written"
             if len(looked_up) < len(extraction.configs) else "")
    table = Table(caption=f"{escape(model)}: {extraction.node_count} nodes -> {len(looked_up)} distinct op "
                  f"configs the compiler looks up ({ops - sum(away.values())} ops){fused}; "
                  f"{len(extraction.unmapped)} not mapped", caption_justify="left")
    for col in ("op type", "description", "count", "fused away", "nodes"):
        table.add_column(col, overflow="fold", justify="right" if col in ("count", "fused away") else "left")
    for c in extraction.configs:
        nodes = ["+".join(n) for n in extraction.nodes[c.key]]
        more = f" (+{len(nodes) - 3})" if len(nodes) > 3 else ""
        table.add_row(c.op_type, _description(c), str(extraction.count(c)), str(away.get(c.key, "")),
                      escape(", ".join(nodes[:3]) + more))
    out.print(table)
    if extraction.unmapped:
        table = Table(title="not mapped to a kernel-DB op", title_justify="left")
        for col in ("node", "op type", "reason"):
            table.add_column(col, overflow="fold")
        for u in extraction.unmapped:
            table.add_row(escape(shorten(u.node, 40)), escape(u.op_type), escape(u.reason))
        out.print(table)
    for note in extraction.notes:
        out.print(f"note: {note.node}: {note.text}", markup=False, highlight=False, soft_wrap=True)
    from console.cli.cmd_coverage import print_blockers

    print_blockers(model, extraction.blockers)


def _check(args: argparse.Namespace) -> int:
    configs: list[OpConfig] = []
    errors: list[InputError] = []
    for name in args.files:
        try:
            parsed = read_opconfigs(Path(name))
        except InputError as exc:  # the whole file is unusable; the others are still checked
            errors.append(exc)
            continue
        configs.extend(parsed.configs)
        errors.extend(parsed.errors)
    counts = Counter(c.key for c in configs)
    distinct = dedupe(configs)
    if args.json:
        print_json({"files": len(args.files), "total": len(configs),
                    "configs": [{"config": c.to_dict(), "description": c.describe(), "count": counts[c.key],
                                 "first": c.source} for c in distinct],
                    "errors": [{"where": e.where, "reason": e.reason} for e in errors]})
        return 1 if errors else 0
    from rich.markup import escape
    from rich.table import Table

    table = Table(caption=f"{len(configs)} op configs in {len(args.files)} files, {len(distinct)} distinct, "
                  f"{len(errors)} errors", caption_justify="left")
    for col in ("op type", "description", "count", "first at"):
        table.add_column(col, overflow="fold", justify="right" if col == "count" else "left")
    for c in distinct:
        table.add_row(c.op_type, _description(c), str(counts[c.key]), escape(c.source))
    out.print(table)
    for e in errors:
        out.print(f"[red]error[/] {escape(str(e))}", highlight=False)
    return 1 if errors else 0
