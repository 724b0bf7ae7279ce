"""kdb db init | check | repair | fastest | standalone | leave-to-library | undo | convert | backup.

The maintenance verbs parse, make the core plan (core/db/maintenance.py), and print it; --apply writes it."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from console.cli.output import out, print_json
from core.db.kernel_db import KernelDB, Schema

if TYPE_CHECKING:
    from core.db.edit import Applied
    from core.db.library import Verdict
    from core.db.maintenance import Plan


def main(args: argparse.Namespace) -> int:
    return {"init": _init, "check": _check, "repair": _repair, "fastest": _fastest, "standalone": _standalone,
            "leave-to-library": _leave_to_library, "undo": _undo, "convert": _convert,
            "backup": _backup}[args.db_command](args)


def _init(args: argparse.Namespace) -> int:
    with KernelDB.open(args.db, create=True) as db:
        if args.json:
            print_json({"db": str(db.path), "schema": db.schema.value})
        else:
            out.print(f"{db.path}: KernelCache ready ({db.schema.value} schema)")
    return 0


def _check(args: argparse.Namespace) -> int:
    from core.db.lint_cache import lint_db

    with KernelDB.open(args.db) as db:
        integrity = db.integrity_check()
        tables = db.tables()
        result = {"db": str(db.path), "schema": db.schema.value, "integrity": integrity, "tables": tables}
        rows, findings = lint_db(db) if db.schema is Schema.CURRENT else (None, [])
        result["rows"] = rows
        disorder = db.order_problems() if db.schema is Schema.CURRENT else []
        result["out_of_order"] = [p.identifier for p in disorder]
    result["lint"] = dict(Counter(f.severity for f in findings))
    extra = [t for t in tables if t != "KernelCache"]
    ok = integrity == ["ok"] and not any(f.severity != "warning" for f in findings)
    if args.json:
        print_json({**result, "ok": ok, "other_tables": extra})
    else:
        out.print(f"{result['db']}: schema {result['schema']}, {result['rows']} rows, integrity "
                  f"{'ok' if integrity == ['ok'] else '; '.join(integrity[:5])}")
        if extra:
            out.print(f"[yellow]other tables in the NNFusion file: {', '.join(extra)}[/]")
        out.print(f"lint: {result['lint'] or 'no findings'} (`kdb lint` lists them)")
        if disorder:
            out.print(f"[yellow]{len(disorder)} op(s) whose first row, the one NNFusion takes, is not their fastest "
                      "(or cannot be ranked): `kdb db repair` names them and puts them in order[/]")
        if db.schema is Schema.OSDI20:
            out.print("older osdi20 schema: read-only here; `kdb db convert OLD NEW` rewrites it")
    return 0 if ok else 1


def _repair(args: argparse.Namespace) -> int:
    """Fused kernels without their CUDA twin get it, rows in an older form than injection writes are brought up to
    date, ops whose rows are not fastest-first are put in order (--apply); nothing else in the DB is touched."""
    from core.db.maintenance import repair_plan

    with KernelDB.open(args.db, write=args.apply) as db:
        plan = repair_plan(db)
        applied = _apply(db, plan, args.apply)
    found = plan.details
    if args.json:
        print_json({**_plan_json(plan, applied),
                    "missing_twins": [{"key": r.key, "identifier": r.identifier} for r in found.unused],
                    "twins_written": [r.key for r in applied.twins] if applied else [],
                    "lone_twins": [{"key": r.key, "identifier": r.identifier} for r in found.orphans],
                    "misaligned": [{"key": r.key, "identifier": r.identifier} for r, _ in found.realign],
                    "realigned": applied.rewritten if applied else [],
                    "out_of_order": [{"identifier": p.identifier, "first": p.first, "fastest": p.fastest or None,
                                      "why": p.why} for p in found.disorder],
                    "reordered": applied.moved if applied else []})
    else:
        _print_plan(plan, applied)
    return 1 if (plan.writes and not args.apply) or found.orphans else 0


def _standalone(args: argparse.Namespace) -> int:
    """The ops of the rows named run on their own launch, never in a BlockFusion group (or back, --undo)."""
    from core.db.maintenance import standalone_plan
    from core.kernels.ops import DEFAULT_PRODUCT
    from core.settings import load_settings

    product = args.product or load_settings().product_name
    with KernelDB.open(args.db, write=args.apply) as db:
        plan = standalone_plan(db, args.keys, product, back=args.undo)
        applied = _apply(db, plan, args.apply)
    if args.json:
        print_json({**_plan_json(plan, applied), "undo": args.undo,
                    "product": None if args.undo else product or DEFAULT_PRODUCT,
                    "rows": [{"key": c.row.key, "identifier": c.row.identifier, "source": c.source, "tags": c.tags}
                             for c in plan.details], "written": applied.rewritten if applied else []})
    else:
        _print_plan(plan, applied)
    return 0


def _fastest(args: argparse.Namespace) -> int:
    """Per op, keep the row measured fastest on one GPU (--apply); else show what would go and why. kdb keeps that
    row first already; deleting the others keeps BlockFusion from swapping in a slower row of smaller time x
    resource, and mends DBs another tool wrote."""
    from core.db.maintenance import fastest_plan
    from core.settings import load_settings

    with KernelDB.open(args.db, write=args.apply) as db:
        plan = fastest_plan(db, args.product or load_settings().product_name)
        applied = _apply(db, plan, args.apply)
    found = plan.details
    if args.json:
        print_json({**_plan_json(plan, applied), "device": found.device,
                    "rows_removed": len(applied.deleted) if applied else 0,
                    "ops": [{"identifier": c.identifier, "kept": c.kept.key, "kept_us": c.kept.us,
                             "removed": [{"key": lo.key, "us": lo.us} for lo in c.removed]}
                            for c in found.choices],
                    "unranked": found.unranked,
                    "unreadable": [{"key": k, "reason": why} for k, why in found.unreadable]})
    else:
        _print_plan(plan, applied)
    return 0


def _leave_to_library(args: argparse.Namespace) -> int:
    """Ops whose row ran slower than the library on a GPU: show them, set their rows aside (--apply), or put rows
    set aside back (--undo FILE, as `kdb db undo FILE`)."""
    from core.db.maintenance import library_plan
    from core.errors import InputError

    if args.undo:
        args.file = args.undo
        return _undo(args)
    if not args.times:
        raise InputError("name the times file (TIMES.json), or --undo FILE", where="leave-to-library")
    with KernelDB.open(args.db, write=args.apply) as db:
        plan = library_plan(db, Path(args.times).expanduser(), args.margin)
        applied = _apply(db, plan, args.apply)
    found = plan.details
    if args.json:
        print_json({**_plan_json(plan, applied), "device": found.device,
                    "rows_removed": len(applied.deleted) if applied else 0,
                    "slower": [_verdict(v) for v in found.slower], "kept": [_verdict(v) for v in found.kept],
                    "not_measured": [{**_verdict(v), "why": v.why} for v in found.not_measured],
                    "absent": found.absent})
    else:
        _print_plan(plan, applied)
    return 1 if plan.writes and not args.apply else 0


def _undo(args: argparse.Namespace) -> int:
    """Put back exactly what an --apply changed, from the undo file it wrote (a preview unless --apply)."""
    from core.db.maintenance import undo_plan

    with KernelDB.open(args.db, write=args.apply) as db:
        plan = undo_plan(db, Path(args.file).expanduser())
        applied = _apply(db, plan, args.apply)
    if args.json:
        print_json({**_plan_json(plan, applied), "rows": [{"key": ln.key, "identifier": ln.identifier,
                                                           "action": ln.action} for ln in plan.lines],
                    "rows_written": applied.written if applied else 0})
    else:
        _print_plan(plan, applied)
    return 0


def _verdict(v: Verdict) -> dict[str, object]:
    return {"identifier": v.identifier, "op_type": v.op_type, "key": v.key, "rows": list(v.rows),
            "row_us": v.row_us, "library_us": v.library_us,
            "extra_us": v.extra_us if v.row_us is not None and v.library_us is not None else None}


def _apply(db: KernelDB, plan: Plan, apply: bool) -> Applied | None:
    from core.db.maintenance import apply_plan

    return apply_plan(db, plan) if apply else None


def _plan_json(plan: Plan, applied: Applied | None) -> dict[str, Any]:
    return {"db": str(plan.db), "applied": applied is not None,
            "undo_file": str(applied.undo_file) if applied and applied.undo_file else None, "plan": plan.as_dict()}


def _print_plan(plan: Plan, applied: Applied | None) -> None:
    """The plan as both faces show it: its title, a line per row, its notes; then what was written, or that nothing
    was."""
    out.print(f"{plan.db}: {plan.title}", markup=False, highlight=False)
    for line in plan.lines:
        why = f" ({line.why})" if line.why else ""
        out.print(f"  {line.action} {line.key}{why}  {line.identifier[:90]}", markup=False, highlight=False)
    for note in plan.notes:
        out.print(f"  {note}", markup=False, highlight=False)
    if applied is not None and applied.undo_file is not None:
        out.print(f"written in one transaction; `kdb db undo {applied.undo_file} --apply` puts back what it changed",
                  markup=False, highlight=False)
    elif plan.writes and applied is None:
        out.print("nothing written: add --apply to write it (one transaction, its undo file first)")


def _convert(args: argparse.Namespace) -> int:
    from core.db.convert import convert_db

    report = convert_db(Path(args.old).expanduser(), Path(args.new).expanduser())
    if args.json:
        print_json({"converted": report.converted, "failed": report.failed, "dest": report.dest})
    else:
        out.print(f"{report.converted} rows converted into {report.dest}; {len(report.failed)} could not be")
        for f in report.failed:
            out.print(f"  row {f['rowid']}: {f['reason']}")
    return 1 if report.failed else 0


def _backup(args: argparse.Namespace) -> int:
    from core.db.state import state_dir

    with KernelDB.open(args.db) as db:
        if args.dest:
            dest = db.backup(Path(args.dest).expanduser())
        else:
            dest = db.backup_to_new_file(state_dir() / "backups", db.path.stem)
    if args.json:
        print_json({"db": str(db.path), "backup": str(dest)})
    else:
        out.print(f"backup written: {dest}")
    return 0
