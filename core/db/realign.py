"""Rows injected before a row's shared arrays kept the alignment they asked for (1f8bb1c): `kdb db repair`.

Such a row runs right but declares TVM's `alignas(64)` arrays as plain float arrays, so nvcc reads them 4 bytes
at a time (the H200 ran one 1.79x its tuning record). Repair writes the symbols as injection writes them now;
the row keeps its Key (the kernel's code is the same), its place in the table and its profile."""

from __future__ import annotations

import json
import re
from typing import Any

from core.cuda.source import parse_kernel
from core.db.kernel_db import KernelDB
from core.errors import InputError
from core.kernels.export import row_to_item
from core.kernels.kernel_row import KernelRow, declared_symbols
from core.kernels.ops import DEVICE_TYPE

ASKS_FOR_ALIGNMENT = "(Function LIKE ? OR Function LIKE ?)"
RealignPlan = list[tuple[KernelRow, dict[str, Any]]]  # (row, its Function with the symbols written now)
_ALIGN_PREFIX = re.compile(r"^\s*__align__\s*\(\s*\d+\s*\)\s*")


def realigned_function(row: KernelRow) -> dict[str, Any] | None:
    """The row's Function with its shared_memory symbols as injection writes them now, or None when they need
    no change. The alignment each array asked for is read from the row's own kernel (`row_to_item`'s code: TVM's
    declarations are still in function_body); a row whose symbols are not the names of those arrays, or whose
    kernel does not read back, is left alone (`kdb lint` names what is wrong with it)."""
    try:
        src = parse_kernel(row_to_item(row)["code"])
    except InputError:
        return None
    function = json.loads(row.function)  # row_to_item read it: a JSON object
    shared = function.get("shared_memory") if isinstance(function.get("shared_memory"), dict) else {}
    symbols = shared.get("symbol") or []
    wanted = declared_symbols(src.shared)
    if [_ALIGN_PREFIX.sub("", str(s)) for s in symbols] != [d.symbol for d in src.shared] or wanted == symbols:
        return None
    return {**function, "shared_memory": {**shared, "symbol": wanted}}


def plan_realign(db: KernelDB) -> RealignPlan:
    """(row, its Function with the symbols written now) for each kernel whose symbols lost their alignment."""
    plan: RealignPlan = []
    for row in db.iter_rows(f"WHERE DeviceType = ? AND {ASKS_FOR_ALIGNMENT}",
                            [DEVICE_TYPE, "%alignas(%", "%__align__(%"]):
        function = realigned_function(row)
        if function is not None:
            plan.append((row, function))
    return plan


def apply_realign(db: KernelDB, plan: RealignPlan) -> list[str]:
    """Rewrite each planned row's Function (a fused kernel's CUDA twin follows); the keys written."""
    for row, function in plan:
        db.update_function(row.key, function)
    return [row.key for row, _ in plan]
