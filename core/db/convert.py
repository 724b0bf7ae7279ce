"""Rewrite a kernel DB of the older osdi20 schema into the current one.

osdi20 rows: KernelCache(identifier, platform, function, tags, profile, resource), where function
is the import tool's JSON config (op_type, in_shape, out_shape, parameters, function_body without
shared declarations, shared_memory, num_sync, gridDim, blockDim). Its identifiers concatenate shapes
without separators (so distinct shapes collide): they are rebuilt from the shapes, never copied.
The new file is written under a temporary name and renamed when complete: never half-written.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.db.kernel_db import KernelDB, Schema
from core.errors import DbError, InputError, KdbError
from core.kernels.kernel_row import KernelRow, kernel_key, nnfusion_signature
from core.kernels.ops import CONV_FAMILY, DEVICE_TYPE, EXTERNAL_SOURCE, INJECTABLE_OP_TYPES, POOLS, tags_for
from core.kernels.opsig import ConvParams, DotParams, OpSignature, PoolParams
from core.kernels.profile import format_profile, parse_profile


@dataclass
class ConvertReport:
    converted: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)
    dest: str = ""


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputError(f"{what} is not a list of integers")
    return tuple(value)


def convert_osdi20_row(identifier: Any, platform: Any, function: Any, tags: Any, profile: Any,
                       resource: Any) -> KernelRow:
    """One osdi20 row as a current-schema row; InputError says why it cannot be converted."""
    try:
        cfg = json.loads(function)
    except (TypeError, ValueError) as exc:
        raise InputError(f"function is not JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise InputError("function is not a JSON object")
    op_type = cfg.get("op_type")
    if op_type not in INJECTABLE_OP_TYPES:
        raise InputError(f"op type {op_type!r} is not supported by the current compiler")
    ins = tuple(_ints(s, "in_shape") for s in cfg.get("in_shape") or [])
    outs = tuple(_ints(s, "out_shape") for s in cfg.get("out_shape") or [])
    if not ins or not outs:
        raise InputError("in_shape/out_shape missing")
    params = cfg.get("parameters") or {}
    sig_params: ConvParams | PoolParams | DotParams | None = None
    if op_type in CONV_FAMILY:
        sig_params = ConvParams(_ints(params.get("window_movement_strides"), "window_movement_strides"),
                                _ints(params.get("window_dilation_strides"), "window_dilation_strides"),
                                _ints(params.get("padding_below_diff"), "padding_below_diff"))
        if op_type == "Fused_Convolution_Add_Relu" and len(ins) == 2:
            ins = (*ins, outs[0])
    elif op_type in POOLS:
        if "padding_above" not in params:
            raise InputError("pool row has no padding_above: the current compiler's identifier needs it")
        sig_params = PoolParams(_ints(params.get("window_shape"), "window_shape"),
                                _ints(params.get("window_stride"), "window_stride"),
                                _ints(params.get("padding_below"), "padding_below"),
                                _ints(params["padding_above"], "padding_above"))
    tag_list = tags.split(",") if isinstance(tags, str) else []
    if op_type == "Dot":
        sig_params = DotParams("transA" in tag_list, "transB" in tag_list)
    sig = OpSignature(op_type, ins, outs, sig_params)
    block_body = cfg.get("function_body")
    if not isinstance(block_body, str):
        raise InputError("function_body missing")
    sm = cfg.get("shared_memory") or {"symbol": [], "dtype": [], "size": []}
    decls = "".join(f"__shared__ {t} {s}[{n}];\n"
                    for s, t, n in zip(sm.get("symbol", []), sm.get("dtype", []), sm.get("size", []), strict=False))
    grid = _ints(cfg.get("gridDim"), "gridDim")
    block = _ints(cfg.get("blockDim"), "blockDim")
    num_sync = cfg.get("num_sync", cfg.get("num_syncthreads"))
    if not isinstance(num_sync, int):
        raise InputError("num_sync missing: the barrier count is unknown")
    inputs = [f"input{i}" for i in range(len(ins))]
    signature = nnfusion_signature("float", [*inputs, "output0"], math.prod(block))
    function_body = decls + block_body
    fn = {"function_signature": signature, "function_body": function_body, "grid_dim": list(grid),
          "block_dim": list(block), "block_function_body": block_body, "shared_memory": sm,
          "num_syncthreads": num_sync}
    time = ""
    if isinstance(profile, str) and profile:
        text = profile if profile.endswith(";") else profile + ";"
        time = format_profile(parse_profile(text))
    miscs = {"external_profile": {"time": time, "resource": int(resource) if isinstance(resource, int) else 0},
             "kdb": {"converted_from": "osdi20", "osdi20_identifier": identifier,
                     "osdi20_platform": platform}}
    ident = sig.identifier
    return KernelRow(
        key=kernel_key(ident, grid, block, function_body), identifier=ident, op_type=op_type,
        attributes=json.dumps(sig.attributes()), source=EXTERNAL_SOURCE, device_type=DEVICE_TYPE,
        function=json.dumps(fn, ensure_ascii=False), tags=tags_for(op_type, *(
            (sig_params.transpose_a, sig_params.transpose_b) if isinstance(sig_params, DotParams) else ())),
        miscs=json.dumps(miscs, ensure_ascii=False),
    )


def convert_db(old: Path, new: Path, *, on_row: Callable[[int], None] | None = None) -> ConvertReport:
    """Write the current-schema DB `new` from `old` (osdi20 or current); `new` must not exist."""
    if new.exists():
        raise DbError(f"{new} exists; choose a new file name (nothing was written)")
    report = ConvertReport(dest=str(new))
    tmp = new.with_name(f".{new.name}.converting")
    if tmp.exists():
        tmp.unlink()
    with KernelDB.open(old) as src, KernelDB.open(tmp, create=True) as dst:
        if src.schema is Schema.OSDI20:
            for rowid, *cols in src.iter_osdi20():
                try:
                    row = convert_osdi20_row(*cols)
                    dst.insert(row)
                    report.converted += 1
                except KdbError as exc:
                    report.failed.append({"rowid": rowid, "identifier": str(cols[0])[:200], "reason": exc.reason})
                if on_row:
                    on_row(rowid)
        elif src.schema is Schema.CURRENT:
            for row in src.iter_table_order():  # the compiler takes an identifier's first row: keep the order
                dst.insert(row)
                report.converted += 1
        else:
            raise DbError(f"{old} holds no KernelCache table")
    os.replace(tmp, new)
    for suffix in ("-wal", "-shm"):
        leftover = Path(str(tmp) + suffix)
        if leftover.exists():
            leftover.unlink()
    return report
