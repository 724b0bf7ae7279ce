"""Rows injected before a row's shared arrays kept the alignment they asked for (1f8bb1c): `kdb db repair`.

Such a row runs right but declares TVM's `alignas(64)` arrays as plain float arrays, so nvcc reads them 4 bytes
at a time (the H200 ran one 1.79x its tuning record). Repair writes the symbols as injection writes them now;
the row keeps its Key (the kernel's code is the same), its place in the table and its profile."""

from __future__ import annotations

import json
from typing import Any

from core.db.kernel_db import KernelDB
from core.kernels.kernel_row import KernelRow, realigned_symbols
from core.kernels.ops import DEVICE_TYPE

ASKS_FOR_ALIGNMENT = "(Function LIKE ? OR Function LIKE ?)"
RealignPlan = list[tuple[KernelRow, dict[str, Any]]]  # (row, its Function with the symbols written now)


def plan_realign(db: KernelDB) -> RealignPlan:
    """(row, its Function with the symbols written now) for each kernel whose symbols lost their alignment."""
    plan: RealignPlan = []
    for row in db.iter_rows(f"WHERE DeviceType = ? AND {ASKS_FOR_ALIGNMENT}",
                            [DEVICE_TYPE, "%alignas(%", "%__align__(%"]):
        try:
            function = json.loads(row.function)
        except ValueError:  # `kdb lint` names an unreadable Function; nothing to realign in it
            continue
        symbols = realigned_symbols(function) if isinstance(function, dict) else None
        if symbols is not None:
            plan.append((row, {**function, "shared_memory": {**function["shared_memory"], "symbol": symbols}}))
    return plan


def apply_realign(db: KernelDB, plan: RealignPlan) -> list[str]:
    """Rewrite each planned row's Function (a fused kernel's CUDA twin follows); the keys written."""
    for row, function in plan:
        db.update_function(row.key, function)
    return [row.key for row, _ in plan]
