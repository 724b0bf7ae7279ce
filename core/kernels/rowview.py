"""A kernel row taken apart for people: what `kdb show` and the console's detail pane display."""

from __future__ import annotations

import json
from typing import Any

from core.kernels.kernel_row import KernelRow, shared_bytes
from core.kernels.math_kind import precision, units
from core.kernels.profile import parse_profile


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def describe_row(row: KernelRow) -> dict[str, Any]:
    fn = _load(row.function)
    fn = fn if isinstance(fn, dict) else {}
    miscs = _load(row.miscs)
    miscs = miscs if isinstance(miscs, dict) else {}
    attrs = _load(row.attributes)
    prof = miscs.get("external_profile") if isinstance(miscs.get("external_profile"), dict) else {}
    resource = prof.get("resource") if isinstance(prof.get("resource"), int | float) else None
    profile, profile_error = [], ""
    try:
        times = parse_profile(prof.get("time", "")) if prof else {}
    except Exception as exc:
        times, profile_error = {}, str(exc)
    for device, us in times.items():
        profile.append({"device": device, "us": us, "resource": resource,
                        "efficiency": us * resource if resource is not None else float("nan")})
    sm = fn.get("shared_memory") if isinstance(fn.get("shared_memory"), dict) else {}
    table = []
    for s, t, n in zip(sm.get("symbol", []), sm.get("dtype", []), sm.get("size", []), strict=False):
        table.append({"symbol": s, "dtype": t, "size": n,
                      "bytes": shared_bytes({"shared_memory": {"dtype": [t], "size": [n]}})})
    kdb = miscs.get("kdb") if isinstance(miscs.get("kdb"), dict) else {}
    return {
        "key": row.key, "identifier": row.identifier, "op_type": row.op, "source": row.source,
        "device_type": row.device_type, "tags": row.tags, "name": kdb.get("name", ""),
        "precision": precision(row.identifier, row.attributes), "units": units(row.function),
        "attributes": attrs, "grid": fn.get("grid_dim"), "block": fn.get("block_dim"),
        "num_syncthreads": fn.get("num_syncthreads"), "resource": resource,
        "shared_memory": table, "shared_bytes": shared_bytes(fn) if fn else None,
        "profile": profile, "profile_error": profile_error,
        "signature": fn.get("function_signature", ""), "body": fn.get("function_body", ""),
        "block_body": fn.get("block_function_body", ""), "notes": kdb.get("notes", []),
        "compile": kdb.get("compile", {}), "miscs": miscs,
    }
