"""kdb db init | check | repair | fastest | standalone | leave-to-library | convert | backup."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from console.cli.output import out, print_json
from core.db.kernel_db import KernelDB, Schema

if TYPE_CHECKING:
    from core.db.library import Verdict


def main(args: argparse.Namespace) -> int:
    return {"init": _init, "check": _check, "repair": _repair, "fastest": _fastest, "standalone": _standalone,
            "leave-to-library": _leave_to_library, "convert": _convert, "backup": _backup}[args.db_command](args)


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
    """Fused kernels without their CUDA twin get it, rows in an older form than injection writes (shared arrays
    without their alignment, pointers without __restrict__) are brought up to date, ops whose rows are not
    fastest-first are put in order (--apply); nothing else in the DB is touched."""
    from core.db.realign import apply_realign, plan_realign

    with KernelDB.open(args.db, write=args.apply) as db:
        unused, orphans = db.pair_problems()
        realign = plan_realign(db)
        disorder = db.order_problems()
        rankable = [p for p in disorder if p.fastest]
        reordered = db.put_in_order([p.identifier for p in rankable]) if args.apply else []
        written = db.add_twins([r.key for r in unused]) if args.apply else []
        realigned = apply_realign(db, realign) if args.apply else []
    if args.json:
        print_json({"db": str(db.path), "applied": args.apply,
                    "missing_twins": [{"key": r.key, "identifier": r.identifier} for r in unused],
                    "twins_written": [r.key for r in written],
                    "lone_twins": [{"key": r.key, "identifier": r.identifier} for r in orphans],
                    "misaligned": [{"key": r.key, "identifier": r.identifier} for r, _ in realign],
                    "realigned": realigned,
                    "out_of_order": [{"identifier": p.identifier, "first": p.first, "fastest": p.fastest or None,
                                      "why": p.why} for p in disorder],
                    "reordered": reordered})
    else:
        if disorder:
            verb = "put" if args.apply else "would put"
            out.print(f"{len(rankable)} op(s) whose first row, the one NNFusion takes, is not their fastest: {verb} "
                      "their rows fastest-first (the rows stay as they are)", highlight=False)
            for p in disorder:
                out.print(f"  {p.identifier[:90]}: {p.why}", markup=False, highlight=False)
        if realign:
            verb = "rewrote" if args.apply else "would rewrite"
            out.print(f"{len(realign)} kernel(s) in an older form than injection writes: shared arrays declared "
                      "without the alignment their code asks for (nvcc reads them 4 bytes at a time), or pointers "
                      f"without __restrict__ (no read-only loads); {verb} their signature and shared_memory symbols "
                      "(the code, the Key and the profile stay)", highlight=False)
            for r, _ in realign:
                out.print(f"  {r.key}  {r.identifier}", markup=False, highlight=False)
        verb = "added" if args.apply else "would add"
        out.print(f"{db.path}: {len(unused)} fused kernel(s) without the CUDA row the compiler needs to use them; "
                  f"{verb} {len(written) if args.apply else len(unused)} twin row(s)", highlight=False)
        for r in unused:
            out.print(f"  {r.key}  {r.identifier}", markup=False, highlight=False)
        if orphans:
            out.print(f"{len(orphans)} CUDA row(s) without a CUDA_GPU kernel of their identifier make the compiler "
                      "abort; repair leaves them alone: delete them, or inject their kernel", highlight=False)
            for r in orphans:
                out.print(f"  {r.key}  {r.identifier}", markup=False, highlight=False)
        if (unused or realign or rankable) and not args.apply:
            out.print("nothing written: `kdb db repair --apply` writes them")
    left = (not args.apply and (unused or realign or rankable)) or orphans
    return 1 if left else 0


def _standalone(args: argparse.Namespace) -> int:
    """The ops of the rows named run on their own launch, never in a BlockFusion group (or back, --undo)."""
    from core.db.standalone import apply_changes, plan_fusable, plan_standalone
    from core.kernels.ops import DEFAULT_PRODUCT
    from core.settings import load_settings

    product = args.product or load_settings().product_name or DEFAULT_PRODUCT
    with KernelDB.open(args.db, write=args.apply) as db:
        plan = plan_fusable(db, args.keys) if args.undo else plan_standalone(db, args.keys, product)
        written = apply_changes(db, plan) if args.apply else []
    if args.json:
        print_json({"db": str(db.path), "applied": args.apply, "undo": args.undo,
                    "product": None if args.undo else product,
                    "rows": [{"key": c.row.key, "identifier": c.row.identifier, "source": c.source, "tags": c.tags}
                             for c in plan], "written": written})
        return 0
    what = "back to BlockFusion (External rows)" if args.undo else \
        f"standalone for -fproduct_name={product!r}: on their own launch, never in a BlockFusion group"
    verb = "changed" if args.apply else "would change"
    out.print(f"{db.path}: {verb} {len(plan)} row(s) {what}; the code, the Key and the profile stay", highlight=False)
    return _list_rows([c.row for c in plan], args.apply)


def _fastest(args: argparse.Namespace) -> int:
    """Per op, keep the row measured fastest on one GPU (--apply); else show what would go and why. kdb keeps that
    row first already; deleting the others keeps BlockFusion from swapping in a slower row of smaller time x
    resource, and mends DBs another tool wrote."""
    from core.db.fastest import apply_fastest, plan_fastest, profiled_devices
    from core.db.state import state_dir
    from core.errors import InputError
    from core.settings import load_settings

    with KernelDB.open(args.db, write=args.apply) as db:
        device = args.product or load_settings().product_name
        if not device:
            devices = sorted(profiled_devices(db))
            if len(devices) != 1:
                raise InputError("name the GPU the kernels were timed on: --product NAME (NNFusion's "
                                 "-fproduct_name)" + (f"; this DB has times for {', '.join(devices)}" if devices
                                                      else "; no row of this DB has a profile"), where=str(db.path))
            device = devices[0]
        plan = plan_fastest(db, device)
        removed = apply_fastest(db, plan, state_dir() / "backups") if args.apply else []
    if args.json:
        print_json({"db": str(db.path), "device": device, "applied": args.apply,
                    "backup": str(plan.backup) if plan.backup else None, "rows_removed": len(removed),
                    "ops": [{"identifier": c.identifier, "kept": c.kept.key, "kept_us": c.kept.us,
                             "removed": [{"key": lo.key, "us": lo.us} for lo in c.removed]}
                            for c in plan.choices],
                    "unranked": plan.unranked,
                    "unreadable": [{"key": k, "reason": why} for k, why in plan.unreadable]})
        return 0
    changing = [c for c in plan.choices if c.removed]
    done = f"removed {len(plan.removals)} kernel(s) ({len(removed)} rows, CUDA twins included)" if args.apply \
        else f"would remove {len(plan.removals)} kernel(s)"
    out.print(f"{db.path}: {len(changing)} op(s) with more than one row, ranked by their time on {device}; {done}",
              highlight=False)
    for c in changing:
        out.print(f"  {c.kept.op_type}: keep {c.kept.key} ({c.kept.us or 0:.2f} us)  {c.identifier[:90]}", markup=False,
                  highlight=False)
        for lo in c.removed:
            why = f"{lo.us:.2f} us" if lo.us is not None else f"not measured on {device}"
            out.print(f"    drop {lo.key} ({why})", markup=False, highlight=False)
    if plan.unranked:
        out.print(f"{len(plan.unranked)} op(s) with several rows, none timed on {device}: left as they are "
                  "(`kdb gpu profile` times them)", highlight=False)
    for key, why in plan.unreadable:
        out.print(f"  {key}: unreadable profile, counted as not measured: {why}", markup=False, highlight=False)
    if plan.backup:
        out.print(f"backup written first: {plan.backup}", highlight=False)
    elif plan.removals and not args.apply:
        out.print("nothing written: `kdb db fastest --apply` removes them (one transaction, after a backup)")
    return 0


def _leave_to_library(args: argparse.Namespace) -> int:
    """Ops whose row ran slower than the library on a GPU: show them, set their rows aside (--apply), or put rows
    set aside back (--undo FILE)."""
    from core.db.library import apply_leave_to_library, plan_leave_to_library, read_times, set_aside_rows
    from core.db.library import undo_leave_to_library as undo
    from core.db.state import state_dir
    from core.errors import InputError

    if args.undo:
        rows = set_aside_rows(Path(args.undo).expanduser())
        with KernelDB.open(args.db, write=args.apply) as db:
            written = undo(db, Path(args.undo).expanduser()) if args.apply else 0
        if args.json:
            print_json({"db": str(db.path), "applied": args.apply, "undo": args.undo,
                        "rows": [{"key": r.key, "identifier": r.identifier} for r in rows], "rows_written": written})
            return 0
        verb = f"put back {written} row(s)" if args.apply else f"would put back {len(rows)} kernel(s)"
        out.print(f"{db.path}: {verb} from {args.undo}", highlight=False)
        return _list_rows(rows, args.apply)
    if not args.times:
        raise InputError("name the times file (TIMES.json), or --undo FILE", where="leave-to-library")
    if not 0 <= args.margin < 1000:
        raise InputError(f"--margin {args.margin:g}: expected a percentage of 0 or more", where="--margin")
    device, times = read_times(Path(args.times).expanduser())
    with KernelDB.open(args.db, write=args.apply) as db:
        plan = plan_leave_to_library(db, device, times, args.margin / 100)
        removed = apply_leave_to_library(db, plan, state_dir() / "backups") if args.apply else []
    if args.json:
        print_json({"db": str(db.path), "device": device, "applied": args.apply,
                    "set_aside": str(plan.set_aside) if plan.set_aside else None, "rows_removed": len(removed),
                    "slower": [_verdict(v) for v in plan.slower], "kept": [_verdict(v) for v in plan.kept],
                    "not_measured": [{**_verdict(v), "why": v.why} for v in plan.not_measured],
                    "absent": plan.absent})
        return 1 if plan.slower and not args.apply else 0
    verb = "left" if args.apply else "would leave"
    out.print(f"{db.path}: {len(plan.slower)} op(s) whose row ran slower than the library on {device}: {verb} them "
              "to the library", highlight=False)
    for line in plan.describe():
        out.print(f"  {line}", markup=False, highlight=False)
    if plan.set_aside:
        out.print(f"removed {len(removed)} row(s), set aside first in {plan.set_aside}; "
                  f"`kdb db leave-to-library --undo {plan.set_aside} --apply` puts them back", highlight=False)
    elif plan.slower:
        out.print("nothing written: add --apply to remove them (one transaction, the rows set aside first)")
    return 1 if plan.slower and not args.apply else 0


def _verdict(v: Verdict) -> dict[str, object]:
    return {"identifier": v.identifier, "op_type": v.op_type, "key": v.key, "rows": list(v.rows),
            "row_us": v.row_us, "library_us": v.library_us,
            "extra_us": v.extra_us if v.row_us is not None and v.library_us is not None else None}


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


def _list_rows(rows: Sequence[Any], applied: bool) -> int:
    """A plan's rows, a line each (Key, identifier), and the word that a preview wrote nothing."""
    for r in rows:
        out.print(f"  {r.key}  {r.identifier[:100]}", markup=False, highlight=False)
    if rows and not applied:
        out.print("nothing written: add --apply to write it")
    return 0
