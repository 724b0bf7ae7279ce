"""One kernel per op, the fastest measured on a GPU: the others deleted.

NNFusion's kernel selection takes an op's FIRST External row in table order and does not compare profiles
(kernel_selection.cpp, FetchBasedSelector::fetch_inventory). kdb's own writes keep each op's rows fastest-first
(core/db/op_rows.py), so the first row is already the fastest; what `kdb db fastest` still adds is deleting the
slower rows: BlockFusion's interplay can otherwise swap in any row with a smaller time x resource (a slower one:
ResNet-18 ran 1.46x slower on the H200 with such rows), and a DB written by another tool (or by kdb before the
order was kept) gets its fastest row as the op's only one. `plan_fastest` finds, for each op (Identifier and Tags,
DeviceType CUDA_GPU), the row with the smallest time for one device in `Miscs.external_profile.time`;
the maintenance plan (core/db/maintenance.py, fastest_plan) removes the other rows of those ops (a fused kernel's
CUDA twin goes with its row) in one transaction, their undo file written first.

Only ops with at least one row measured on the device are touched. A row not measured there cannot be
ranked: it is removed with the reason "not measured", so `kdb gpu profile` it first to keep it in the race.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from core.db.kernel_db import KernelDB
from core.db.op_rows import time_on
from core.errors import InputError
from core.kernels.ops import DEVICE_TYPE
from core.kernels.profile import parse_profile


@dataclass(frozen=True)
class Ranked:
    key: str
    op_type: str
    us: float | None  # its time on the device; None: not measured there


@dataclass(frozen=True)
class OpChoice:
    identifier: str
    kept: Ranked  # its `us` is never None
    removed: tuple[Ranked, ...]


@dataclass
class FastestPlan:
    device: str
    choices: list[OpChoice] = field(default_factory=list)  # ops with more than one row, one measured
    unranked: list[str] = field(default_factory=list)  # ops with several rows, none measured on the device
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (key, why): a profile string broken

    @property
    def removals(self) -> list[str]:
        return [loser.key for choice in self.choices for loser in choice.removed]


def profiled_devices(db: KernelDB) -> set[str]:
    """Every device name that some row's profile names (for a default when only one GPU timed this DB)."""
    devices: set[str] = set()
    query = "SELECT Miscs FROM KernelCache WHERE DeviceType = ? AND Miscs LIKE '%external_profile%'"
    for (miscs_text,) in db.connection().execute(query, (DEVICE_TYPE,)):
        try:
            miscs = json.loads(miscs_text or "{}")
            profile = miscs.get("external_profile", {}) if isinstance(miscs, dict) else {}
            devices.update(parse_profile(profile.get("time", "") if isinstance(profile, dict) else ""))
        except (ValueError, InputError):
            continue  # plan_fastest names these rows
    return devices


def plan_fastest(db: KernelDB, device: str) -> FastestPlan:
    """What keeping each op's fastest row would remove, op by op, and why; reads only.

    Two passes, neither holding a kernel's source: SQLite counts the rows of each op, then one scan in table
    order reads Key, OpType and Miscs of the ops that have more than one."""
    plan = FastestPlan(device)
    conn = db.connection()
    where = "WHERE DeviceType = ? AND Source = 'External'"
    several = {(ident, tags) for ident, tags in conn.execute(
        f"SELECT Identifier, Tags FROM KernelCache {where} GROUP BY Identifier, Tags HAVING COUNT(*) > 1",
        (DEVICE_TYPE,))}
    ops: dict[tuple[str, str], list[Ranked]] = {}
    if several:
        for key, identifier, tags, op_type, miscs in conn.execute(
                f"SELECT Key, Identifier, Tags, OpType, Miscs FROM KernelCache {where} ORDER BY rowid", (DEVICE_TYPE,)):
            if (identifier, tags) not in several:
                continue
            try:
                us: float | None = time_on(miscs, device)
            except InputError as exc:
                if not str(exc).startswith("not measured"):
                    plan.unreadable.append((key, str(exc)))
                us = None
            ops.setdefault((identifier, tags), []).append(Ranked(key, op_type, us))
    for (identifier, _tags), rows in ops.items():
        measured = [r for r in rows if r.us is not None]
        if not measured:
            plan.unranked.append(identifier)
            continue
        kept = min(measured, key=lambda r: r.us or 0.0)  # the first of equal times: table order
        plan.choices.append(OpChoice(identifier, kept, tuple(r for r in rows if r.key != kept.key)))
    return plan


def shadowed(db: KernelDB, keys: list[str]) -> list[tuple[str, str]]:
    """(key, the key the compiler takes instead) for each of `keys` that is not its op's first External row.

    One pass over the table per 500 identifiers: NNFusion's file has no index on Identifier, and may add none."""
    conn = db.connection()
    wanted: dict[str, str] = {}  # key -> identifier, CUDA_GPU rows only
    for key in keys:
        got = conn.execute("SELECT Identifier, DeviceType FROM KernelCache WHERE Key = ?", (key,)).fetchone()
        if got is not None and got[1] == DEVICE_TYPE:
            wanted[key] = got[0]
    identifiers = sorted(set(wanted.values()))
    first: dict[str, str] = {}
    for i in range(0, len(identifiers), 500):
        chunk = identifiers[i:i + 500]
        marks = ",".join("?" * len(chunk))
        for identifier, key in conn.execute(
                f"SELECT Identifier, Key FROM KernelCache WHERE DeviceType = ? AND Source = 'External' "
                f"AND Identifier IN ({marks}) ORDER BY rowid", (DEVICE_TYPE, *chunk)):
            first.setdefault(identifier, key)
    return [(key, first[ident]) for key, ident in wanted.items() if first.get(ident, key) != key]
