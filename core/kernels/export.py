"""Rows back to kernel JSON (the artifact format), so kernels can move between DBs and be re-injected.

The exported code is the row's own standalone kernel: `extern "C" __global__ void <name>(<signature
parameters>) {<function_body>}`. Injecting it again gives the same Key, so a round trip is a no-op.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.cuda.warps import unpad_body
from core.errors import InputError
from core.kernels.kernel_row import KernelRow, distinct_kernels
from core.kernels.ops import BATCH_MATMUL, CONV_FAMILY, CONV_TRANSPOSE, DEPTHWISE, POOLS, RESIZE

_SAFE_NAME = re.compile(r"[^A-Za-z0-9_]")


def row_to_item(row: KernelRow) -> dict[str, Any]:
    try:
        fn = json.loads(row.function)
        attrs = json.loads(row.attributes)
        miscs = json.loads(row.miscs) if row.miscs else {}
    except ValueError as exc:
        raise InputError(f"row {row.key[:20]} has a column that is not JSON: {exc}") from exc
    if not isinstance(fn, dict) or not isinstance(attrs, dict):
        raise InputError(f"row {row.key[:20]}: Function/Attributes are not JSON objects")
    kdb = miscs.get("kdb", {}) if isinstance(miscs, dict) else {}
    name = _SAFE_NAME.sub("_", str(kdb.get("name") or f"kdb_{row.key[4:16]}")) or "kdb_kernel"
    if name[0].isdigit():
        name = "k_" + name
    sig = str(fn.get("function_signature", ""))
    if "void (" not in sig:
        raise InputError(f"row {row.key[:20]}: unexpected function_signature {sig[:60]!r}")
    body, block = str(fn.get("function_body", "")), fn.get("block_dim")
    unpadded = unpad_body(body) if kdb.get("warp_padded") else None
    if unpadded is not None:  # the kernel as it came: injecting it pads it again, to the same row
        body, threads = unpadded
        sig = re.sub(r"__launch_bounds__\(\s*\d+", f"__launch_bounds__({threads}", sig, count=1)
        block = [threads, 1, 1]
    code = sig.replace("void (", f"void {name}(", 1) + " {" + body + "}"
    ins, outs = attrs.get("input_shape", []), attrs.get("output_shape", [])
    p = attrs.get("parameters", {}) or {}
    op = row.op
    if op in (*CONV_FAMILY, DEPTHWISE, CONV_TRANSPOSE):
        params: dict[str, Any] = {"input_shape": ins[0], "filter_shape": ins[1], "output_shape": outs[0], **p}
    elif op == "Dot":
        params = {"arg0_shape": ins[0], "arg1_shape": ins[1], "out_shape": outs[0],
                  "transpose_A": bool(p.get("transpose_A", False)), "transpose_B": bool(p.get("transpose_B", False))}
    elif op == BATCH_MATMUL:
        params = {"arg0_shape": ins[0], "arg1_shape": ins[1], "out_shape": outs[0]}
    elif op in (*POOLS, RESIZE):  # (a Resize's second input is its scales: the identifier's, not a parameter)
        params = {"input_shape": ins[0], "output_shape": outs[0], **p}
    elif len(ins) == 1:
        params = {"input_shape": ins[0], "output_shape": outs[0]}
    else:
        params = {"input_shapes": ins, "output_shape": outs[0]}
    item: dict[str, Any] = {"tvm_func_name": name, "op_type": op, "parameters": params, "code": code,
                            "gridDim": fn.get("grid_dim"), "blockDim": block}
    if attrs.get("dtype", "float") != "float":
        item["dtype"] = attrs["dtype"]
    if attrs.get("math"):
        item["math"] = attrs["math"]
    return item


def write_kernel_json(rows: Iterable[KernelRow], path: Path) -> int:
    """The rows' distinct kernels as one kernel JSON file (written whole, then renamed into place); the count.
    `kdb inject --replace` of that file rewrites the rows under today's rules (padding, launch bounds)."""
    items = [row_to_item(r) for r in distinct_kernels(rows)]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(items, indent=1), encoding="utf-8")
    tmp.replace(path)
    return len(items)
