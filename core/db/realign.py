"""Rows injected in an older form than injection writes now: `kdb db repair` brings them up to date in place.

- Shared arrays without the alignment they asked for (before 1f8bb1c): the row runs right but declares TVM's
  `alignas(64)` arrays as plain float arrays, so nvcc reads them 4 bytes at a time (the H200 ran one 1.79x its
  tuning record, 0.52x that once realigned).
- Pointers without `__restrict__` (before the twelfth session; see core.kernels.kernel_row.nnfusion_signature):
  no read-only loads (`ld.global.nc`).

Neither changes the kernel's code, so the row keeps its Key, its place in the table and its profile (which was
timed in the older form: `kdb gpu profile` times it again)."""

from __future__ import annotations

import json
import re
from typing import Any

from core.cuda.source import parse_kernel
from core.db.kernel_db import KernelDB
from core.errors import InputError
from core.kernels.export import row_to_item
from core.kernels.kernel_row import ALIGN_PREFIX, KernelRow, declared_symbols
from core.kernels.ops import DEVICE_TYPE, EXTERNAL_SOURCE

# rows that may be in an older form: arrays that ask for alignment, or no __restrict__ (instr: `_` is a LIKE wildcard)
OLDER_FORM = "(Function LIKE ? OR Function LIKE ? OR instr(Function, '__restrict__') = 0)"
RealignPlan = list[tuple[KernelRow, dict[str, Any]]]  # (row, its Function as injection writes it now)
# The signature injection writes (nnfusion_signature), with or without the one-block bound of a spilling kernel
_ROW_SIGNATURE = re.compile(r'^(extern "C" __launch_bounds__\(\s*\d+(?:\s*,\s*\d+)?\s*\) __global__ void \()(.*)\)$')
_PLAIN_POINTER = re.compile(r"^([\w ]*\w)\s*\*\s*((?:input|output)\d+)$")


def realigned_function(row: KernelRow) -> dict[str, Any] | None:
    """The row's Function as injection writes it now (shared_memory symbols with their alignment, `__restrict__`
    pointers), or None when it needs no change. The alignment each array asked for is read from the row's own
    kernel (`row_to_item`'s code: TVM's declarations are still in function_body); symbols that are not the names
    of those arrays, a signature of another form, and a kernel that does not read back are left alone (`kdb lint`
    names what is wrong with such a row)."""
    try:
        src = parse_kernel(row_to_item(row)["code"])
    except InputError:
        return None
    function = json.loads(row.function)  # row_to_item read it: a JSON object
    updated = dict(function)
    shared = function.get("shared_memory") if isinstance(function.get("shared_memory"), dict) else {}
    symbols = shared.get("symbol") or []
    wanted = declared_symbols(src.shared)
    if [ALIGN_PREFIX.sub("", str(s)) for s in symbols] == [d.symbol for d in src.shared] and wanted != symbols:
        updated["shared_memory"] = {**shared, "symbol": wanted}
    # __restrict__ only where NNFusion's KernelDB emitter compiles the row: an External row gets no in-place pair
    signature = restricted_signature(str(function.get("function_signature", "")))
    if signature is not None and row.source == EXTERNAL_SOURCE:
        updated["function_signature"] = signature
    return updated if updated != function else None


def restricted_signature(signature: str) -> str | None:
    """The signature with `__restrict__` on each pointer, or None when it has them or is not of the form
    injection writes (`extern "C" __launch_bounds__(N) __global__ void (float* input0, ..., float* output0)`)."""
    match = _ROW_SIGNATURE.match(signature.strip())
    if match is None:
        return None
    pointers = [_PLAIN_POINTER.match(p.strip()) for p in match.group(2).split(",")]
    if not all(pointers):
        return None
    return match.group(1) + ", ".join(f"{p.group(1)}* __restrict__ {p.group(2)}" for p in pointers if p) + ")"


def plan_realign(db: KernelDB) -> RealignPlan:
    """(row, its Function as injection writes it now) for each kernel in an older form."""
    plan: RealignPlan = []
    for row in db.iter_rows(f"WHERE DeviceType = ? AND {OLDER_FORM}",
                            [DEVICE_TYPE, "%alignas(%", "%__align__(%"]):
        function = realigned_function(row)
        if function is not None:
            plan.append((row, function))
    return plan
