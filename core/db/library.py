"""Ops whose DB row runs slower than what NNFusion runs without it: leave them to the library.

Without a row for an op, NNFusion runs cuDNN (convolutions, pools), cuBLAS (Dot) or its own kernel (element-wise
ops; a fused Conv+Add+Relu becomes cuDNN's convolution plus NNFusion's element-wise kernel). A tuned row that is
slower than that makes the network slower than the empty DB would. Given each op's time on one GPU for its row and
for the library, `plan_leave_to_library` names the ops whose row is slower and by how much; the maintenance plan
(core/db/maintenance.py, library_plan) deletes every CUDA_GPU row of those ops (a fused kernel's CUDA twin with its
row) in one transaction, their undo file written first; `kdb db undo FILE` puts them back.

Times are only acted on when measured on a GPU: the times file names the GPU, and an op whose library or row time
is missing is "not measured" and left alone. A row time not in the file is the row's own profile for that GPU
(written only by a GPU run). The times file (JSON):

    {"device": "NVIDIA H200",
     "ops": [{"identifier": "Convolution1,64,56,56;...", "library_us": 9.8, "row_us": 12.5}, ...]}

Other keys, at the top or in an op, are read by people and ignored here: `kdb nnfusion MODEL --op-times TIMES.json`
(core/gpu/library_times.py, which writes the file with write_times) adds how and where the times were measured,
each op's row Key, what the library runs for it, and the ops it could not time with the reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.db.kernel_db import KernelDB
from core.db.op_rows import op_rows, profile_times
from core.errors import InputError

NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class OpTimes:
    """One op's times on the plan's GPU, in microseconds (None: not measured)."""

    identifier: str
    library_us: float | None
    row_us: float | None = None  # None: the profile of the row the compiler takes


@dataclass(frozen=True)
class Verdict:
    identifier: str
    op_type: str
    key: str  # the row the compiler takes: the op's first (rows are kept fastest-first)
    rows: tuple[str, ...]  # every CUDA_GPU row of the op
    row_us: float | None
    library_us: float | None
    why: str = ""  # why it cannot be judged ("not measured: ..."); "" when both times are known

    @property
    def extra_us(self) -> float:
        """What the row costs over the library per run of the op (negative: it saves that much)."""
        return (self.row_us or 0.0) - (self.library_us or 0.0)

    @property
    def ratio(self) -> float:
        return (self.row_us or 0.0) / self.library_us if self.library_us else math.inf


@dataclass
class LibraryPlan:
    device: str
    slower: list[Verdict] = field(default_factory=list)  # their rows go: the library is faster
    kept: list[Verdict] = field(default_factory=list)  # the row is at least as fast
    not_measured: list[Verdict] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # identifiers without a CUDA_GPU row in the DB

    @property
    def removals(self) -> list[str]:
        return [key for verdict in self.slower for key in verdict.rows]

    def slower_lines(self) -> list[tuple[Verdict, str]]:
        """(verdict, why its rows go) for each op whose row is slower, slowest first."""
        return [(v, f"its op's row {v.key} takes {v.row_us:g} us, the library {v.library_us:g} us on {self.device}: "
                    f"{v.extra_us:g} us ({v.ratio:.2f}x) slower") for v in self.slower]

    def describe_others(self) -> list[str]:
        """One line per op judged and left as it is, and per op not in the DB."""
        lines = [f"{v.op_type}: row {v.row_us:g} us, library {v.library_us:g} us: the row stays  {v.identifier[:90]}"
                 for v in self.kept]
        lines += [f"{v.op_type}: {v.why}: left as it is  {v.identifier[:90]}" for v in self.not_measured]
        lines += [f"no row in the DB: {identifier[:100]}" for identifier in self.absent]
        return lines


def read_times(path: Path) -> tuple[str, list[OpTimes]]:
    """(the GPU, each op's times) from a times file; InputError names the file, the item and the reason."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read it ({exc.strerror or exc})", where=str(path)) from exc
    except ValueError as exc:
        raise InputError(f"not JSON ({exc})", where=str(path)) from exc
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise InputError("expected an object with \"device\" and a list \"ops\"", where=str(path))
    device = data.get("device")
    if not isinstance(device, str) or not device.strip():
        raise InputError(f"\"device\" must name the GPU the times were measured on ({NOT_MEASURED} "
                         "otherwise)", where=str(path))
    ops = []
    for i, item in enumerate(data["ops"]):
        where = f"{path}: ops[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("identifier"), str) or not item["identifier"]:
            raise InputError("expected an object with an \"identifier\"", where=where)
        ops.append(OpTimes(item["identifier"], _time(item, "library_us", where), _time(item, "row_us", where)))
    return device, ops


def write_times(path: Path, device: str, ops: list[dict[str, Any]], about: dict[str, Any]) -> None:
    """Write a times file: the GPU, each op (its "identifier", "library_us" and "row_us", and what else `about` it
    the writer keeps), and `about` the whole at the top. Read back with read_times before it replaces `path`, so a
    file this module would refuse is never written; written whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**about, "device": device, "ops": ops}, indent=1, allow_nan=False) + "\n",
                   encoding="utf-8")
    try:
        read_times(tmp)
    except InputError:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def _time(item: dict[str, Any], name: str, where: str) -> float | None:
    value = item.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} {value!r} is not a positive time in microseconds (null: {NOT_MEASURED})",
                         where=where)
    return float(value)


def plan_leave_to_library(db: KernelDB, device: str, times: list[OpTimes], margin: float = 0.0) -> LibraryPlan:
    """Which ops' rows run slower than the library on `device` by more than `margin` (a fraction: 0.05 = 5%);
    reads only."""
    if not device.strip():
        raise InputError(f"the times name no GPU: {NOT_MEASURED}", where="device")
    plan = LibraryPlan(device)
    with db.reading() as raw:
        for op in times:
            rows = op_rows(raw, op.identifier)
            if not rows:
                plan.absent.append(op.identifier)
                continue
            first = rows[0]
            op_type = raw.execute("SELECT OpType FROM KernelCache WHERE Key = ?", (first.key,)).fetchone()[0]
            row_us = op.row_us if op.row_us is not None else profile_times(first.miscs).get(device)
            missing = [what for what, us in (("the library", op.library_us), ("its row", row_us)) if us is None]
            verdict = Verdict(op.identifier, op_type, first.key, tuple(r.key for r in rows), row_us, op.library_us,
                              f"{NOT_MEASURED} on {device}: {' and '.join(missing)}" if missing else "")
            if missing:
                plan.not_measured.append(verdict)
            elif verdict.ratio > 1.0 + margin:
                plan.slower.append(verdict)
            else:
                plan.kept.append(verdict)
    plan.slower.sort(key=lambda v: -v.extra_us)
    return plan
