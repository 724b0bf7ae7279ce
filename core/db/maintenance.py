"""DB maintenance as previewable plans, the one implementation behind `kdb db repair | fastest | standalone |
leave-to-library | undo` and the Kernels view's F, K, S, d and u.

A plan reads the DB and says what it would change, as data (`Plan`: a title, a line per row it touches, notes on
what it leaves alone and why); `apply_plan` writes it in one transaction with an undo file written first; `undo_plan`
reads an undo file and plans putting back exactly what the apply changed (core/db/edit.py: why an undo file and no
whole-DB backup, and how both sides refuse a DB that moved on). Neither face phrases a plan: both show its title,
lines and notes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.db.edit import (
    Applied,
    DbEdit,
    apply_edit,
    fingerprint,
    iter_undo_rows,
    read_undo_file,
    row_digest,
    undo_edit,
)
from core.db.fastest import FastestPlan, plan_fastest, profiled_devices
from core.db.kernel_db import KernelDB
from core.db.library import LibraryPlan, plan_leave_to_library, read_times
from core.db.op_rows import OrderProblem
from core.db.realign import plan_realign
from core.db.standalone import RowChange, plan_fusable, plan_standalone
from core.errors import InputError
from core.kernels.kernel_row import TWIN_SUFFIX, KernelRow, is_pattern_twin, needs_pattern_twin, primary_key, twin_key
from core.kernels.ops import DEFAULT_PRODUCT, DEVICE_TYPE

OLDER_FORM = ("kernel(s) in an older form than injection writes: shared arrays declared without the alignment their "
              "code asks for (nvcc reads them 4 bytes at a time), or pointers without __restrict__ (no read-only "
              "loads); their signature and shared_memory symbols are rewritten, the code, the Key and the profile stay")


@dataclass(frozen=True)
class PlanLine:
    """One row the plan touches (or keeps, to say why the others go)."""

    action: str  # keep | drop | rewrite | add | reorder | restore
    key: str
    identifier: str
    why: str = ""


@dataclass
class Plan:
    verb: str  # the `kdb db` verb it is (fusable: `standalone --undo`; delete: the Kernels view's d)
    db: Path
    title: str  # what applying it does, an imperative: "Keep only the fastest row of 2 op(s) on NVIDIA H200"
    lines: list[PlanLine]
    notes: list[str]  # what it leaves alone, and why
    edit: DbEdit
    expected: str  # fingerprint of the rows of edit.ops when the plan was made
    details: Any = field(default=None, repr=False)  # the verb's own findings, for its JSON report

    @property
    def writes(self) -> bool:
        return not self.edit.empty

    def as_dict(self) -> dict[str, Any]:
        return {"verb": self.verb, "db": str(self.db), "title": self.title, "writes": self.writes,
                "lines": [asdict(line) for line in self.lines], "notes": self.notes}


def _plan(db: KernelDB, verb: str, title: str, lines: list[PlanLine], notes: list[str], edit: DbEdit,
          details: Any = None) -> Plan:
    expected = fingerprint(db.iter_op_rows(edit.ops)) if not edit.empty else ""
    return Plan(verb, db.path, title, lines, notes, edit, expected, details)


def apply_plan(db: KernelDB, plan: Plan, *, undo_dir: Path | None = None) -> Applied:
    """Write the plan in one transaction, its undo file first (Applied.undo_file); nothing when it writes nothing."""
    if plan.db.resolve() != db.path.resolve():
        raise InputError(f"a plan made for {plan.db} cannot be applied to {db.path}", where=str(db.path))
    return apply_edit(db, plan.edit, verb=plan.verb, expected=plan.expected, undo_dir=undo_dir)


# -- repair --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepairFindings:
    unused: list[KernelRow]  # fused kernels without their CUDA twin
    orphans: list[KernelRow]  # CUDA twins without their kernel: left alone
    realign: list[tuple[KernelRow, dict[str, Any]]]  # rows in an older form, and their Function as written now
    disorder: list[OrderProblem]  # ops whose first row is not their fastest (fastest "": cannot be ranked)


def repair_plan(db: KernelDB) -> Plan:
    """Fused kernels get their CUDA twin, rows in an older form are brought to the form injection writes, ops whose
    rows are not fastest-first are put in order; nothing else is touched."""
    unused, orphans = db.pair_problems()
    realign = plan_realign(db)
    disorder = db.order_problems()
    rankable = [p for p in disorder if p.fastest]
    lines = [PlanLine("add", twin_key(r.key), r.identifier, f"the CUDA twin NNFusion needs to use fused kernel {r.key}")
             for r in unused]
    lines += [PlanLine("rewrite", r.key, r.identifier, "older form: shared arrays' alignment, __restrict__ pointers")
              for r, _ in realign]
    lines += [PlanLine("reorder", p.fastest, p.identifier, p.why + ": its rows put fastest-first, each as it is")
              for p in rankable]
    notes = [f"{len(realign)} {OLDER_FORM}"] if realign else []
    notes += [f"{p.identifier[:90]}: {p.why}" for p in disorder if not p.fastest]
    notes += [f"CUDA row {r.key} has no CUDA_GPU kernel of its identifier and makes the compiler abort; repair leaves "
              "it: delete it, or inject its kernel" for r in orphans]
    asks = [f"add the CUDA twin of {len(unused)} fused kernel(s)"] if unused else []
    asks += [f"bring {len(realign)} kernel(s) to the form injection writes now"] if realign else []
    asks += [f"put the rows of {len(rankable)} op(s) fastest-first"] if rankable else []
    title = " and ".join(asks) if asks else "nothing to repair"
    edit = DbEdit(_ops([r.identifier for r in unused] + [r.identifier for r, _ in realign]
                       + [p.identifier for p in rankable]),
                  rewrite=tuple((r.key, {"Function": json.dumps(fn, ensure_ascii=False, allow_nan=False)})
                                for r, fn in realign),
                  add_twins=tuple(r.key for r in unused), reorder=tuple(p.identifier for p in rankable))
    return _plan(db, "repair", title[0].upper() + title[1:], lines, notes, edit,
                 RepairFindings(unused, orphans, realign, disorder))


# -- fastest -------------------------------------------------------------------------------------


def fastest_plan(db: KernelDB, product: str = "") -> Plan:
    """Per op, the row timed fastest on `product` stays and the others go (with their CUDA twins). No product: the
    one GPU this DB's profiles name; InputError when they name none or several."""
    device = product
    if not device:
        devices = sorted(profiled_devices(db))
        if len(devices) != 1:
            raise InputError("which GPU's times rank the rows? Name it (--product NAME, or the product_name setting: "
                             "NNFusion's -fproduct_name)" + (f"; this DB has times for {', '.join(devices)}"
                                                             if devices else "; no row of this DB has a profile"),
                             where=str(db.path))
        device = devices[0]
    found: FastestPlan = plan_fastest(db, device)
    changing = [c for c in found.choices if c.removed]
    lines: list[PlanLine] = []
    for c in changing:
        lines.append(PlanLine("keep", c.kept.key, c.identifier, f"{c.kept.us or 0:.2f} us"))
        lines += [PlanLine("drop", lo.key, c.identifier, f"{lo.us:.2f} us" if lo.us is not None
                           else f"not measured on {device}") for lo in c.removed]
    notes = [f"{len(found.unranked)} op(s) with several rows, none timed on {device}: left as they are "
             "(`kdb gpu profile` times them)"] if found.unranked else []
    notes += [f"{key}: unreadable profile, counted as not measured: {why}" for key, why in found.unreadable]
    unmeasured = sum(1 for line in lines if line.action == "drop" and line.why.startswith("not measured"))
    if found.removals:
        notes.append(f"{len(found.removals)} kernel(s) go ({unmeasured} of them not timed on {device}), with their "
                     "CUDA twins: NNFusion takes an op's first row, and BlockFusion may swap in any row of smaller "
                     "time x resource")
    title = f"Keep only the fastest row of {len(changing)} op(s) on {device}" if changing else \
        f"Every op timed on {device} has one row: nothing to keep or drop"
    return _plan(db, "fastest", title, lines, notes,
                 DbEdit(_ops(c.identifier for c in changing), delete=tuple(found.removals)), found)


# -- standalone ----------------------------------------------------------------------------------


def standalone_plan(db: KernelDB, keys: list[str], product: str = "", *, back: bool = False) -> Plan:
    """The ops of these rows (Keys, Key prefixes or Identifiers) run on their own launch for `product` (none:
    NNFusion's 'default'), never in a BlockFusion group; back=True gives them back to BlockFusion."""
    product = product or DEFAULT_PRODUCT
    changes = plan_fusable(db, keys) if back else plan_standalone(db, keys, product)
    return _standalone(db, changes, product, back)


def toggle_standalone_plan(db: KernelDB, keys: list[str], product: str = "") -> Plan:
    """Back to BlockFusion when some of these ops are standalone, else standalone (the Kernels view's S)."""
    back = standalone_plan(db, keys, product, back=True)
    return back if back.writes else standalone_plan(db, keys, product)


def _standalone(db: KernelDB, changes: list[RowChange], product: str, back: bool) -> Plan:
    ops = _ops(c.row.identifier for c in changes)
    why = "back to BlockFusion: an External row again" if back else f"standalone for -fproduct_name {product!r}"
    lines = [PlanLine("rewrite", c.row.key, c.row.identifier, why) for c in changes]
    if not changes:
        title = "No standalone row of these ops to give back" if back else "No External row of these ops to change"
        notes: list[str] = []
    elif back:
        title = f"Give {len(changes)} standalone row(s) of {len(ops)} op(s) back to BlockFusion"
        notes = ["They become External rows again, which BlockFusion may fuse with other kernels."]
    else:
        title = f"Run {len(changes)} row(s) of {len(ops)} op(s) standalone"
        notes = [f"For -fproduct_name {product!r}, kernel selection then emits each op's kernel on its own launch, "
                 "never fused by BlockFusion: for a fused kernel that cannot launch (`kdb nnfusion` names it). The "
                 "code, the Keys and the profiles stay."]
    edit = DbEdit(ops, rewrite=tuple((c.row.key, c.columns()) for c in changes))
    return _plan(db, "fusable" if back else "standalone", title, lines, notes, edit, changes)


# -- leave to the library ------------------------------------------------------------------------


def library_plan(db: KernelDB, times_file: Path, margin_pct: float = 0.0) -> Plan:
    """Ops whose row ran slower than the library (cuDNN, cuBLAS, NNFusion's own kernel) on the times file's GPU, by
    more than `margin_pct` percent: their rows go, and NNFusion runs the library (core/db/library.py)."""
    if not 0 <= margin_pct < 1000:
        raise InputError(f"margin {margin_pct:g}: expected a percentage of 0 or more", where="--margin")
    device, times = read_times(times_file)
    found: LibraryPlan = plan_leave_to_library(db, device, times, margin_pct / 100)
    lines = [PlanLine("drop", key, v.identifier, why) for v, why in found.slower_lines() for key in v.rows]
    title = f"Leave {len(found.slower)} op(s) whose row ran slower than the library on {device} to the library"
    return _plan(db, "leave-to-library", title, lines, found.describe_others(),
                 DbEdit(_ops(v.identifier for v in found.slower), delete=tuple(found.removals)), found)


# -- delete (the Kernels view's d) ----------------------------------------------------------------


def delete_plan(db: KernelDB, keys: list[str]) -> Plan:
    """These rows go (a fused kernel's two rows together)."""
    rows = [row for key in keys for row in db.find(key) if row.key == key]
    named = {k for row in rows for k in _pair(row)}
    ops = _ops(row.identifier for row in rows)
    lines = [PlanLine("drop", row.key, row.identifier) for row in db.iter_op_rows(ops) if row.key in named]
    kernels = sum(1 for line in lines if not line.key.endswith(TWIN_SUFFIX))
    notes = ["A fused kernel's two rows (CUDA_GPU and its CUDA twin) go together; `u` puts them back."]
    return _plan(db, "delete", f"Delete {kernels} kernel(s) from the DB", lines, notes,
                 DbEdit(ops, delete=tuple(line.key for line in lines)))


def _pair(row: KernelRow) -> tuple[str, ...]:
    if needs_pattern_twin(row):
        return row.key, twin_key(row.key)
    return (row.key, primary_key(row.key)) if is_pattern_twin(row) else (row.key,)


# -- undo ----------------------------------------------------------------------------------------


def undo_plan(db: KernelDB, undo_file: Path) -> Plan:
    """Put back exactly what the apply that wrote `undo_file` changed. InputError: not an undo file, or another DB's;
    DbError: those ops changed since the apply (undoing would lose that change)."""
    record = read_undo_file(undo_file)
    edit = undo_edit(db, record)
    now = {(row.key, row_digest(row)): row.identifier for row in db.iter_op_rows(record.ops)}
    if edit.insert_from is not None:  # a set-aside file of old: its kernels that are missing go back
        present = {key for key, _ in now}
        lines = [PlanLine("restore", r.key, r.identifier) for r in iter_undo_rows(undo_file)
                 if r.key not in present and r.device_type == DEVICE_TYPE]
        title = f"Put back the {len(lines)} kernel(s) {undo_file.name} set aside"
    elif edit.put_back is not None:
        back = {(row.key, row_digest(row)): row.identifier for row in iter_undo_rows(undo_file)}
        lines = [PlanLine("restore", key, ident) for (key, digest), ident in back.items() if (key, digest) not in now]
        lines += [PlanLine("drop", key, ident) for (key, digest), ident in now.items() if (key, digest) not in back]
        title = f"Undo the {record.verb} {undo_file.name} recorded: " \
                f"{sum(ln.action == 'restore' for ln in lines)} row(s) back as they were, " \
                f"{sum(ln.action == 'drop' for ln in lines)} go"
    else:
        lines, title = [], f"Nothing to undo: the rows {undo_file.name} holds are in the DB as they were"
    return _plan(db, "undo", title, lines, [], edit, record)


def _ops(identifiers: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(identifiers))


__all__ = ["Applied", "Plan", "PlanLine", "RepairFindings", "apply_plan", "delete_plan", "fastest_plan",
           "library_plan", "repair_plan", "standalone_plan", "toggle_standalone_plan", "undo_plan"]
